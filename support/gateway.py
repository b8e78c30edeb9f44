"""The refund gateway: a SIMULATED external payment service, with an Idempotency-Key ledger.

It stands in for the payment provider a real deployment calls instead (set REFUND_GATEWAY_URL to
it and give `issue_refund` that provider's client); it lives in this app only so the demo and the
crash tests have a real HTTP service with a ledger to check. It validates like a real one:

- `POST /gateway/refunds` `{"order_id", "amount_cents", "reason"}` with an `Idempotency-Key`
  header creates at most one refund per key and answers a repeated key with the same body
  (DESIGN.md 6). With `REFUND_GATEWAY_KEY` set, it requires `Authorization: Bearer <key>` (401).
  The order must exist (404) and the amount must be a positive integer no larger than what was
  paid for it (422). Each refund is checked on its own, not against the sum of earlier ones: the
  crash lab's naive side (support/crashlab.py) must be able to refund twice, which is the harm it
  measures.
- `GET /gateway/refunds?order_id=...` lists what it actually executed (open, for the demo).

Every refusal is JSON `{"error": ...}` with a 4xx status; no input reaches the database unchecked.
"""

from __future__ import annotations

import hmac
import time

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from agentruns.api.parsing import BadRequest, check_text, json_error, parse_json_body
from agentruns.tokens import bearer_from_header
from support.conf import demo_conf
from support.models import GatewayRefund, Order

ORDER_ID_MAX = GatewayRefund._meta.get_field("order_id").max_length
KEY_MAX = GatewayRefund._meta.get_field("idempotency_key").max_length
REASON_MAX = 1000


@csrf_exempt
def refunds(request: HttpRequest) -> JsonResponse:
    try:
        if request.method == "GET":
            return _list(request)
        if request.method == "POST":
            return _refund(request)
    except BadRequest as exc:
        return json_error(str(exc), exc.status, **exc.extra)
    response = json_error(f"method {request.method} not allowed", 405)
    response["Allow"] = "GET, POST"
    return response


def _list(request: HttpRequest) -> JsonResponse:
    rows = GatewayRefund.objects.order_by("id")
    order_id = request.GET.get("order_id")
    if order_id:
        check_text(order_id, "order_id")
        if len(order_id) > ORDER_ID_MAX:
            return JsonResponse({"refunds": []})  # no order has such an id
        rows = rows.filter(order_id=order_id)
    return JsonResponse({"refunds": [r.as_dict() for r in rows]})


def _authorised(request: HttpRequest) -> bool:
    expected = demo_conf.GATEWAY_KEY
    if not expected:
        return True  # no key configured: an open demo gateway
    given = bearer_from_header(request.headers.get("Authorization"))
    return hmac.compare_digest(given.encode(), expected.encode())


def _refund(request: HttpRequest) -> JsonResponse:
    if not _authorised(request):
        return json_error("send 'Authorization: Bearer <REFUND_GATEWAY_KEY>'", 401)
    if demo_conf.GATEWAY_DELAY_MS:
        time.sleep(demo_conf.GATEWAY_DELAY_MS / 1000)
    if demo_conf.GATEWAY_FAIL:
        return json_error("refund service unavailable", 503)
    key = request.headers.get("Idempotency-Key", "").strip()
    if not key:
        raise BadRequest("Idempotency-Key header is required")
    if len(key) > KEY_MAX or not key.isprintable():
        raise BadRequest(f"Idempotency-Key must be at most {KEY_MAX} printable characters")
    body = parse_json_body(request)
    order_id, amount, reason = (
        body.get("order_id"),
        body.get("amount_cents"),
        body.get("reason", ""),
    )
    if not isinstance(order_id, str) or not order_id:
        raise BadRequest("order_id is required")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise BadRequest("amount_cents must be a positive integer")
    if not isinstance(reason, str):
        raise BadRequest("reason must be a string")
    existing = GatewayRefund.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return _replay(existing, order_id, amount)
    if len(order_id) > ORDER_ID_MAX:
        raise BadRequest(f"no order {order_id[:ORDER_ID_MAX]}…", 404)
    order = Order.objects.filter(order_id=order_id).only("amount_cents").first()
    if order is None:
        raise BadRequest(f"no order {order_id}", 404)
    if amount > order.amount_cents:
        raise BadRequest(
            f"amount_cents {amount} is more than was paid for {order_id} ({order.amount_cents})",
            422,
        )
    try:
        with transaction.atomic():
            refund = GatewayRefund.objects.create(
                order_id=order_id,
                amount_cents=amount,
                reason=reason[:REASON_MAX],
                idempotency_key=key,
                traceparent=request.headers.get("traceparent", "")[:55],
            )
    except IntegrityError:  # a concurrent request with the same key won
        return _replay(GatewayRefund.objects.get(idempotency_key=key), order_id, amount)
    return JsonResponse(refund.as_dict(), status=201)


def _replay(existing: GatewayRefund, order_id: str, amount: int) -> JsonResponse:
    if existing.order_id != order_id or existing.amount_cents != amount:
        return json_error("Idempotency-Key was already used with different parameters", 422)
    return JsonResponse(existing.as_dict(), status=200)
