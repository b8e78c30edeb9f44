"""`POST /api/hooks/<token>`: an outside system resumes the run waiting on `token` with a JSON
body (`registry.wait_for_event` returns it in the tool), exactly once.

Who may: a bearer token whose user has `agentruns.resolve_hook`, or a machine sender signing
with Standard Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`: HMAC-
SHA256 of `id.timestamp.body` with AGENTRUNS_HOOK_SECRET; the one signature helper the
outgoing webhooks use). A signature that does not verify or is older than five minutes: 401;
signed requests while no secret is set: 403. The signature does not cover the URL's token, so a
`webhook-id` is taken once (`resolve_hook`'s receipt): a captured request sent again, to this
token or another, within its five minutes is 409.

Every request, found or not, takes a token of its sender's bucket (a user's; the signed sender's,
before its signature is checked) and of this web process's (`quotas.check_hook`): a burst of
guessed tokens meets 429 with `Retry-After` instead of 404 after 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase

from agentruns.api.endpoint import endpoint, quota_refusal
from agentruns.api.parsing import BadRequest, json_error, parse_json_body
from agentruns.api.schemas import TIME, obj
from agentruns.conf import conf
from agentruns.registry.waits.events import MAX_TOKEN_CHARS
from agentruns.runtime.access.quotas import QuotaExceeded, check_hook
from agentruns.runtime.values.timestamps import iso
from agentruns.runtime.values.webhook_signatures import verified
from agentruns.runtime.waits.hooks import (
    HookReplayed,
    UnknownToken,
    WaitAlreadyResolved,
    resolve_hook,
)

SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
TOKEN = {"type": "string", "minLength": 1, "maxLength": MAX_TOKEN_CHARS, "pattern": "^[^\\x00]+$"}
HEADER = {"type": "string"}
MAX_WEBHOOK_ID_CHARS = 200


def signed(request: HttpRequest) -> HttpResponseBase | bool:
    """A Standard Webhooks signature: True when it verifies, a refusal when it does not, False
    when the request carries none (a bearer token then)."""
    if not request.headers.get("webhook-signature"):
        return False
    if not conf.HOOK_SECRET:
        return json_error("signed hooks are off here: no AGENTRUNS_HOOK_SECRET is set", 403)
    try:  # every signed request counts, before its signature is checked (one with a bad one too)
        check_hook(None)
    except QuotaExceeded as exc:
        return quota_refusal(exc)
    try:
        parse_json_body(request)  # its size and form first: the signature is over the bytes
    except BadRequest as exc:
        return json_error(str(exc), exc.status, **exc.extra)
    headers = {name: request.headers.get(name, "") for name in SIGNATURE_HEADERS}
    try:
        body = request.body.decode("utf-8")
    except UnicodeDecodeError:
        return json_error("the body is not UTF-8", 400)
    if not verified(conf.HOOK_SECRET, headers, body):
        return json_error("the webhook signature does not verify (or is stale)", 401)
    if len(headers["webhook-id"]) > MAX_WEBHOOK_ID_CHARS:
        return json_error(f"webhook-id is longer than {MAX_WEBHOOK_ID_CHARS} characters", 400)
    return True


@endpoint(
    "POST",
    "/hooks/{token}",
    summary="Resume the run waiting on a hook's token",
    permission="agentruns.resolve_hook",
    path_params={"token": TOKEN},
    body={"type": "object"},
    machine=signed,
    headers={name: HEADER for name in SIGNATURE_HEADERS},
    responses={
        200: "the run waiting on the token resumes with the body",
        401: "no valid bearer token or signature",
        403: "no right to resolve hooks",
        404: "no run waits on this token",
        409: "the token was resolved already (when, and by whom), or a signed request's "
        "webhook-id was taken before (a replay)",
        429: "too many hook resolutions by this sender, or at this server (Retry-After)",
    },
    example={"status": "delivered", "at": "2026-12-24T09:00:00Z"},
    tags=("hooks",),
    returns=obj({"run_id": {"type": "string", "format": "uuid"}, "resolved_at": TIME}),
)
def post_hook(request: HttpRequest, token: str, body: dict[str, Any]) -> Any:
    """The body is what the run's `wait_for_event(token)` returns."""
    user = getattr(request, "user", None)
    receipt = None
    if user is not None and user.is_authenticated:
        by = user.get_username()
        check_hook(user)  # before the token is looked up: a guess costs as much as a resolution
    else:  # a signed request (`signed` verified it, and counted it)
        receipt = request.headers.get("webhook-id", "")
        by = f"webhook {receipt}".strip()
    try:
        wait = resolve_hook(token, body, by=by, receipt=receipt)
    except HookReplayed as exc:
        return {"error": str(exc), "received_at": iso(exc.receipt.received_at)}, 409
    except UnknownToken:
        return {"error": "no run waits on this token"}, 404
    except WaitAlreadyResolved as exc:
        first = exc.wait
        return {
            "error": str(exc),
            "run_id": str(first.run_id),
            "resolved_at": iso(first.resolved_at),
            "resolved_by": first.resolved_by,
        }, 409
    return {"run_id": str(wait.run_id), "resolved_at": iso(wait.resolved_at)}
