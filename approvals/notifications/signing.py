"""Standard Webhooks signatures for the approvals app's outgoing webhooks: the one helper lives in
`agentruns/runtime/values/webhook_signatures.py` (hooks into runs check signatures with it)."""

from agentruns.runtime.values.webhook_signatures import (
    RECOMMENDED_SECRET_BYTES,
    SECRET_PREFIX,
    BadSecret,
    masked,
    new_secret,
    secret_bytes,
    signed_headers,
    verified,
)

__all__ = [
    "RECOMMENDED_SECRET_BYTES",
    "SECRET_PREFIX",
    "BadSecret",
    "masked",
    "new_secret",
    "secret_bytes",
    "signed_headers",
    "verified",
]
