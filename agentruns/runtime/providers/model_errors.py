"""A Pydantic AI model's failure as the engine's `ModelError`: an outage or a verdict.

Pydantic AI raises one error taxonomy for every provider (`pydantic_ai.exceptions`: rate limit,
quota, unavailable, server, connection, timeout, rejected request, authentication, not found),
with the provider's `Retry-After` parsed. The table, as before the hand-written OpenAI client
went:
- retryable (an outage the run backs off from without counting attempts, never sooner than the
  server's `Retry-After`, for up to AGENTRUNS_MODEL_OUTAGE_SECONDS: runtime/outages/model_outage.py):
  429 rate limit, 5xx / 408 / 409 / overloaded / unavailable, a refused or broken connection, a
  timeout, a stream that broke mid-way (the engine re-requests the turn as a new attempt);
- fatal, with the reason (retrying cannot help): 401 / 403 (credentials), 400 / 404 / 422 (the
  request or the model name), 429 `insufficient_quota` / 402 (quota), a content filter, a model
  that cannot be built (missing SDK extra, key or base URL).
The configured API key and anything key-shaped never reach a message.
"""

from __future__ import annotations

import httpx
from pydantic_ai import exceptions as pa

from agentruns.conf import conf
from agentruns.runtime.providers.base import ModelError
from agentruns.runtime.values.redaction import MASK, redact_text

RETRYABLE_STATUS = (408, 409, 429)
DETAIL_CHARS = 500


def scrub(text: str) -> str:
    """Remove the configured key (whatever its format) and anything key-shaped."""
    key = conf.OPENAI_API_KEY
    if key:
        text = text.replace(key, MASK)
    return redact_text(text)


def _detail(exc: BaseException) -> str:
    """The provider's own message: `error.message` of an OpenAI-shaped body, else the body."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:DETAIL_CHARS]
        if body.get("message"):
            return str(body["message"])[:DETAIL_CHARS]
    if body:
        return str(body)[:DETAIL_CHARS]
    return str(getattr(exc, "message", exc))[:DETAIL_CHARS]


def _status(exc: BaseException) -> int | None:
    return exc.status_code if isinstance(exc, pa.ModelHTTPError) else None


def _fatal(what: str, exc: BaseException, at: str, hint: str = "") -> ModelError:
    status = _status(exc)
    code = f" (HTTP {status})" if status else ""
    return ModelError(scrub(f"{what}{code}{at}: {_detail(exc)}{hint}"), retryable=False)


def _outage(what: str, exc: BaseException, at: str) -> ModelError:
    status = _status(exc)
    code = f" (HTTP {status})" if status else ""
    return ModelError(
        scrub(f"{what}{code}{at}: {_detail(exc)}"),
        retryable=True,
        retry_after=getattr(exc, "retry_after", None),
    )


def model_error(exc: BaseException, endpoint: str | None = None) -> ModelError:  # noqa: C901
    """Classify a failure of a model request (`endpoint`: where it went, for the message)."""
    at = f" at {endpoint}" if endpoint else ""
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, pa.ModelAuthenticationError) or _status(exc) in (401, 403):
        hint = " (OPENAI_API_KEY is not set)" if endpoint and not conf.OPENAI_API_KEY else ""
        if endpoint:
            hint += "; check OPENAI_API_KEY and OPENAI_BASE_URL"
        return _fatal("authentication failed", exc, at, hint)
    if isinstance(exc, pa.ModelQuotaExceededError) or (
        isinstance(exc, pa.ModelAPIError) and exc.provider_error_code == "insufficient_quota"
    ):
        return _fatal("quota exhausted", exc, at)
    if isinstance(exc, pa.ModelRateLimitError) or _status(exc) == 429:
        return _outage("rate limited", exc, at)
    if isinstance(exc, pa.ModelTimeoutError | pa.ModelRequestTimeout):
        return ModelError(
            scrub(f"model endpoint{at} timed out: {exc}"), retryable=True, retry_after=None
        )
    if isinstance(exc, pa.ModelConnectionError):
        cause = exc.__cause__ or exc
        return ModelError(
            scrub(
                f"model endpoint{at} unreachable or the stream broke: "
                f"{type(cause).__name__}: {cause}"
            ),
            retryable=True,
        )
    status = _status(exc)
    if isinstance(exc, pa.ModelUnavailableError | pa.ModelServerError) or (
        status is not None and (status >= 500 or status in RETRYABLE_STATUS)
    ):
        return _outage("model server error", exc, at)
    if isinstance(exc, pa.ModelNotFoundError) or status == 404:
        return _fatal("model not found or wrong OPENAI_BASE_URL", exc, at)
    if isinstance(exc, pa.ModelRequestRejectedError) or status is not None:
        return _fatal("invalid request", exc, at)
    if isinstance(exc, pa.ContentFilterError):
        return ModelError(scrub(f"the model's content filter refused: {exc}"), retryable=False)
    if isinstance(exc, pa.ModelAPIError | pa.UnexpectedModelBehavior):
        # an error event inside the stream, or a stream that ended without a valid answer
        return ModelError(scrub(f"the model stream failed{at}: {exc}"), retryable=True)
    if isinstance(exc, OSError | TimeoutError | httpx.TransportError):
        return ModelError(scrub(f"model endpoint{at} unreachable: {exc!r}"), retryable=True)
    return ModelError(scrub(f"model client error: {exc!r}"), retryable=False)
