"""Standard Webhooks signatures (https://www.standardwebhooks.com), by the reference library.

Secrets are `whsec_<base64>`; the signed content is `{webhook-id}.{webhook-timestamp}.{body}`
with HMAC-SHA256, sent as `webhook-signature: v1,<base64>`. The id stays the same on every try
of an event; the timestamp is the try's own (receivers reject stale ones to stop replays).

One helper for both directions: the approvals app signs its outgoing webhooks with
`signed_headers`, and `POST /api/hooks/<token>` checks a machine sender's with `verified`.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from datetime import UTC, datetime

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

SECRET_PREFIX = "whsec_"
# the spec asks for at least 24 random bytes; shorter ones are accepted with a warning (checks)
RECOMMENDED_SECRET_BYTES = 24


class BadSecret(ValueError):
    pass


def secret_bytes(secret: str) -> bytes:
    """The key inside `whsec_<base64>`; BadSecret if it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise BadSecret("a webhook secret looks like whsec_<base64>")
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadSecret("the part after whsec_ is not base64") from None
    if not key:
        raise BadSecret("the webhook secret is empty")
    return key


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signed_headers(secret: str, webhook_id: str, body: str, at: datetime | None = None) -> dict:
    """The three Standard Webhooks headers for one try of `body`."""
    at = at or datetime.now(UTC)
    signature = Webhook(secret_bytes(secret)).sign(webhook_id, at, body)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def verified(secret: str, headers: dict[str, str], body: str) -> bool:
    """`body` carries a valid signature of `secret` in its Standard Webhooks `headers`, with a
    timestamp within the library's tolerance (five minutes: a replayed request is refused)."""
    try:
        Webhook(secret_bytes(secret)).verify(body, headers, json_parse=False)
    except (WebhookVerificationError, ValueError, binascii.Error):
        return False
    return True


def masked(secret: str) -> str:
    """For the admin: enough to tell two secrets apart, not enough to use one."""
    return f"{secret[:10]}…" if secret else "—"
