"""Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, LM Studio, OpenRouter).

Selected by `AGENTRUNS_MODEL=openai/<model name>` (or an agent's `model`). Talks through the
official `openai` SDK with streaming on: text deltas are yielded as they arrive, tool calls are
assembled from their streamed fragments (several per response, arguments split across chunks)
and yielded complete, then the usage of the final chunk.

Failures become `ModelError`s the engine understands:
- 429 / 5xx / 408 / 409 / connection errors are first retried by the SDK inside the same model
  attempt (`OPENAI_MAX_RETRIES`, exponential backoff that honours `Retry-After`); if they persist
  the error is retryable (with the answer's `Retry-After`): an outage the run backs off from for
  up to `AGENTRUNS_MODEL_OUTAGE_SECONDS` without counting attempts (runtime/outages/model_outage.py);
- a stream that breaks or stalls mid-way (`OPENAI_TIMEOUT_SECONDS` between bytes) is retryable:
  the engine re-requests the whole turn as a new attempt and marks the partial text superseded;
- 401 / 403 (credentials), 400 / 404 / 422 (the request or the model name is wrong) and 429
  `insufficient_quota` cannot get better by retrying: `retryable=False`, the run fails with
  the reason.
The API key never appears in an error message or a log line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai

from agentruns.conf import conf
from agentruns.runtime.providers.base import ModelError, ModelRequest, TextDelta, ToolCall, Usage
from agentruns.runtime.values.redaction import MASK, redact_text

log = logging.getLogger(__name__)

# Local servers (Ollama, vLLM, LM Studio) ignore the key, but the SDK insists on one.
PLACEHOLDER_KEY = "not-set"

_clients: dict[tuple, openai.OpenAI] = {}
_clients_lock = threading.Lock()


def _client() -> openai.OpenAI:
    """One client (one keep-alive pool) per process and configuration; q2 forks its workers,
    so a client is never shared across a fork."""
    config = (
        os.getpid(),
        conf.OPENAI_BASE_URL,
        conf.OPENAI_API_KEY,
        conf.OPENAI_TIMEOUT_SECONDS,
        conf.OPENAI_MAX_RETRIES,
    )
    with _clients_lock:
        client = _clients.get(config)
        if client is None:
            for stale in [k for k in _clients if k[0] != os.getpid()]:
                del _clients[stale]  # inherited from the parent: its sockets are not ours
            client = openai.OpenAI(
                base_url=conf.OPENAI_BASE_URL,
                api_key=conf.OPENAI_API_KEY or PLACEHOLDER_KEY,
                timeout=conf.OPENAI_TIMEOUT_SECONDS,
                max_retries=conf.OPENAI_MAX_RETRIES,
            )
            _clients[config] = client
        return client


def request_options() -> dict[str, Any]:
    """Extra body fields for every request, from `OPENAI_REQUEST_OPTIONS` (a JSON object such
    as `{"temperature": 0, "max_tokens": 1024}`); passed through unvalidated so server-specific
    knobs (vLLM's `top_k`, Ollama's `options`) work too."""
    raw = conf.OPENAI_REQUEST_OPTIONS
    if isinstance(raw, dict):
        return dict(raw)
    if not raw.strip():
        return {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"OPENAI_REQUEST_OPTIONS is not valid JSON: {exc}", retryable=False
        ) from None
    if not isinstance(options, dict):
        raise ModelError("OPENAI_REQUEST_OPTIONS must be a JSON object", retryable=False)
    # the provider owns these: the conversation, the tools and the streaming protocol
    for owned in ("model", "messages", "tools", "stream", "stream_options"):
        options.pop(owned, None)
    return options


def _endpoint() -> str:
    """The base URL without any user:password part, safe to put in an error message."""
    parts = urlsplit(conf.OPENAI_BASE_URL)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def scrub(text: str) -> str:
    """Remove the configured key (whatever its format) and anything key-shaped."""
    key = conf.OPENAI_API_KEY
    if key:
        text = text.replace(key, MASK)
    return redact_text(text)


def _server_message(exc: openai.APIError) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
    return str(getattr(exc, "message", "") or exc)


def _error_code(exc: openai.APIError) -> str:
    code = getattr(exc, "code", None)
    body = getattr(exc, "body", None)
    if not code and isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
    return str(code or "")


def retry_after_seconds(exc: openai.APIStatusError) -> float | None:
    """The answer's `Retry-After` (seconds or an HTTP date, RFC 9110 10.2.3), None without one."""
    raw = (exc.response.headers.get("retry-after") or "").strip() if exc.response else ""
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def model_error(exc: openai.OpenAIError) -> ModelError:
    """Classify an SDK error: retrying helps (rate limit, server, network) or it does not."""
    if isinstance(exc, openai.APITimeoutError):
        return ModelError(
            scrub(
                f"model endpoint {_endpoint()} timed out (OPENAI_TIMEOUT_SECONDS="
                f"{conf.OPENAI_TIMEOUT_SECONDS:g})"
            ),
            retryable=True,
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return ModelError(
            scrub(
                f"model endpoint {_endpoint()} unreachable or the stream broke: "
                f"{type(cause).__name__}: {cause}"
            ),
            retryable=True,
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _server_message(exc)
        if status in (401, 403):
            hint = " (OPENAI_API_KEY is not set)" if not conf.OPENAI_API_KEY else ""
            return ModelError(
                scrub(
                    f"authentication failed (HTTP {status}) at {_endpoint()}: {detail}{hint}; "
                    "check OPENAI_API_KEY and OPENAI_BASE_URL"
                ),
                retryable=False,
            )
        if status == 429 and _error_code(exc) == "insufficient_quota":
            return ModelError(
                scrub(f"quota exhausted (HTTP 429) at {_endpoint()}: {detail}"), retryable=False
            )
        if status == 429:
            return ModelError(
                scrub(f"rate limited (HTTP 429) at {_endpoint()}: {detail}"),
                retryable=True,
                retry_after=retry_after_seconds(exc),
            )
        if status >= 500 or status in (408, 409):
            return ModelError(
                scrub(f"model server error (HTTP {status}) at {_endpoint()}: {detail}"),
                retryable=True,
                retry_after=retry_after_seconds(exc),
            )
        what = "model not found or wrong OPENAI_BASE_URL" if status == 404 else "invalid request"
        return ModelError(
            scrub(f"{what} (HTTP {status}) at {_endpoint()}: {detail}"), retryable=False
        )
    if isinstance(exc, openai.APIError):  # an `error` event inside the stream
        return ModelError(
            scrub(f"the model stream reported an error: {_server_message(exc)}"), retryable=True
        )
    return ModelError(scrub(f"model client error: {exc}"), retryable=False)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


class OpenAIProvider:
    waits = True  # a network round trip and seconds of generation: lend the connection back

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def stream(self, request: ModelRequest) -> Iterator[TextDelta | ToolCall | Usage]:
        params: dict[str, Any] = {
            "model": self.model_name,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            params["tools"] = request.tools
        options = request_options()
        text: list[str] = []
        calls: dict[int, _PartialCall] = {}
        usage: Usage | None = None
        try:
            stream = _client().chat.completions.create(**params, extra_body=options or None)
            with stream:
                for chunk in stream:
                    if chunk.usage is not None:
                        usage = Usage(
                            prompt_tokens=int(chunk.usage.prompt_tokens or 0),
                            completion_tokens=int(chunk.usage.completion_tokens or 0),
                        )
                    for choice in chunk.choices or []:
                        delta = choice.delta
                        if delta is None:
                            continue
                        if delta.content:
                            text.append(delta.content)
                            yield TextDelta(delta.content)
                        for fragment in delta.tool_calls or []:
                            self._merge(calls, fragment)
        except openai.OpenAIError as exc:
            error = model_error(exc)
            log.warning("model %s: %s", self.model_name, error)
            raise error from None

        position = len(request.messages)
        for index in sorted(calls):
            call = calls[index]
            if not call.name:
                # a call without a name cannot be executed; the engine records it as failed
                # and tells the model, instead of crashing the turn
                call.name = "(unnamed tool call)"
            yield ToolCall(
                id=call.id or f"call_{position}_{index}", name=call.name, arguments=call.arguments
            )
        if usage is None:
            # the server ignored stream_options.include_usage: estimate so budgets still work
            usage = Usage(
                prompt_tokens=sum(
                    _estimate_tokens(str(m.get("content") or "")) for m in request.messages
                ),
                completion_tokens=_estimate_tokens("".join(text))
                + sum(_estimate_tokens(c.arguments) for c in calls.values()),
            )
        yield usage

    @staticmethod
    def _merge(calls: dict[int, _PartialCall], fragment: Any) -> None:
        """Fold one streamed tool-call fragment into the call at its index."""
        index = fragment.index if fragment.index is not None else len(calls)
        call = calls.setdefault(index, _PartialCall())
        if fragment.id and not call.id:
            call.id = fragment.id
        function = fragment.function
        if function is None:
            return
        if function.name:
            # OpenAI sends the name once; some servers repeat it whole in every fragment
            if not call.name:
                call.name = function.name
            elif function.name != call.name:
                call.name += function.name
        if function.arguments:
            call.arguments += function.arguments
