"""The refund gateway: a simulated external payment service with an Idempotency-Key ledger.

POST /gateway/refunds creates at most one refund per key and answers a repeated key with the same
body; GET /gateway/refunds?order_id=... lists what it actually executed (DESIGN.md 6).
"""

from __future__ import annotations

import json
import time

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from support.conf import demo_conf
from support.models import GatewayRefund


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@csrf_exempt
@require_http_methods(["GET", "POST"])
def refunds(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        rows = GatewayRefund.objects.order_by("id")
        if request.GET.get("order_id"):
            rows = rows.filter(order_id=request.GET["order_id"])
        return JsonResponse({"refunds": [r.as_dict() for r in rows]})
    if demo_conf.GATEWAY_DELAY_MS:
        time.sleep(demo_conf.GATEWAY_DELAY_MS / 1000)
    if demo_conf.GATEWAY_FAIL:
        return _error(503, "refund service unavailable")
    key = request.headers.get("Idempotency-Key", "").strip()
    if not key:
        return _error(400, "Idempotency-Key header is required")
    try:
        body = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "body is not valid JSON")
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object")
    order_id, amount, reason = (
        body.get("order_id"),
        body.get("amount_cents"),
        body.get("reason", ""),
    )
    if not isinstance(order_id, str) or not order_id:
        return _error(400, "order_id is required")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return _error(400, "amount_cents must be a positive integer")
    existing = GatewayRefund.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return _replay(existing, order_id, amount)
    try:
        with transaction.atomic():
            refund = GatewayRefund.objects.create(
                order_id=order_id,
                amount_cents=amount,
                reason=str(reason)[:1000],
                idempotency_key=key,
            )
    except IntegrityError:  # a concurrent request with the same key won
        return _replay(GatewayRefund.objects.get(idempotency_key=key), order_id, amount)
    return JsonResponse(refund.as_dict(), status=201)


def _replay(existing: GatewayRefund, order_id: str, amount: int) -> JsonResponse:
    if existing.order_id != order_id or existing.amount_cents != amount:
        return _error(422, "Idempotency-Key was already used with different parameters")
    return JsonResponse(existing.as_dict(), status=200)
