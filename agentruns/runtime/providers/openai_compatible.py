"""`openai:` / `openai/` models: Pydantic AI's OpenAI Chat Completions model on OPENAI_BASE_URL.

Any OpenAI-compatible server (OpenAI, vLLM, Ollama, LM Studio, OpenRouter) with OPENAI_API_KEY
(local servers ignore it; the SDK insists on one). The SDK's own retries stay on (but not under a
rate limit: below) (`OPENAI_MAX_RETRIES`, exponential, honouring `Retry-After`) inside one model
attempt: a 429 or
5xx before anything streamed re-sends the same request, which has no effect to repeat; what
persists is an outage for the engine (model_errors.py). `OPENAI_TIMEOUT_SECONDS` is the
wait between bytes. `OPENAI_REQUEST_OPTIONS` (a JSON object) is merged into every request body
(`extra_body`), unvalidated, so server-specific knobs (vLLM's `top_k`, Ollama's `options`) work.

One client (one keep-alive pool) per process, thread and configuration: the async client's pool
belongs to the event loop it streams on (the process's run loop, engine/lanes.py, so in effect
one client per process), and q2 forks workers, so a client is never shared across a fork or a
loop. A request under a rate limit waits for its slot (`NOT_BEFORE`) in the client's transport,
the last step before the wire: what Pydantic AI and the SDK do before then cannot make it late, so it reaches the provider when the limit allows it; one
that would still leave too late is not sent, and the SDK does not retry it (`_SlottedWire`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx2  # the transport the SDK speaks (its fork of httpx)

from agentruns.conf import conf
from agentruns.registry.pydantic_agents.calls import thread_loop
from agentruns.runtime.providers.base import NOT_BEFORE, ModelError

if TYPE_CHECKING:  # the SDK is imported where a model is built: it costs a process ~1 s to load
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel

PLACEHOLDER_KEY = "not-set"
PREFIXES = ("openai:", "openai-chat:")
# the provider owns these: the conversation, the tools and the streaming protocol
OWNED_FIELDS = ("model", "messages", "tools", "stream", "stream_options")

_local = threading.local()


def _config() -> tuple:
    return (
        os.getpid(),
        thread_loop(),
        conf.OPENAI_BASE_URL,
        conf.OPENAI_API_KEY,
        conf.OPENAI_TIMEOUT_SECONDS,
        conf.OPENAI_MAX_RETRIES,
        conf.OPENAI_REQUEST_OPTIONS,
    )


def openai_model(name: str) -> OpenAIChatModel:
    """The Chat Completions model for `openai:<model>` at OPENAI_BASE_URL, kept per thread with
    its client (building one costs more than a streamed chunk)."""
    config = _config()
    if getattr(_local, "config", None) != config:
        _local.config, _local.client, _local.models = config, _new_client(), {}
    model = _local.models.get(name)
    if model is None:
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        options = request_options()
        model = OpenAIChatModel(
            name.split(":", 1)[1],
            provider=OpenAIProvider(openai_client=_local.client),
            # the model's own settings, under an agent's or a run's (which Pydantic AI merges)
            settings={"extra_body": options} if options else None,
        )
        _local.models[name] = model
    return model


def _new_client() -> AsyncOpenAI:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    return AsyncOpenAI(
        base_url=conf.OPENAI_BASE_URL,
        api_key=conf.OPENAI_API_KEY or PLACEHOLDER_KEY,
        timeout=conf.OPENAI_TIMEOUT_SECONDS or None,
        max_retries=conf.OPENAI_MAX_RETRIES,
        # the SDK's own default client (its limits, redirects), with the rate-limit slot's hook
        http_client=DefaultAsyncHttpxClient(transport=_SlottedWire()),
    )


class _SlottedWire(httpx2.AsyncBaseTransport):
    """The SDK's transport (its connection limits), keeping a request under a rate limit
    (`NOT_BEFORE`: its slot, set by runtime/access/model_limits.py; the task carries the
    run's context) to its slot:

    - it leaves at its slot, not before;
    - it does not leave when it would leave later than half the jitter allowance after it (its
      process too busy to wake it on time, or an SDK retry after a connection error): arriving
      that late it could share the provider's second with the next slot's request. It is
      answered here, unsent, with a 429 (`slot_missed`): the engine backs off as for the
      provider's, and its next attempt reserves a new slot;
    - its failure (a 429, a 5xx) is not retried by the SDK (`x-should-retry: false`, which the
      SDK obeys): the retry would leave at once, without a slot, past the shared bucket. It
      goes to the engine instead, as above.

    A request without a limit passes through untouched (the SDK retries as configured)."""

    def __init__(self) -> None:
        from openai import DEFAULT_CONNECTION_LIMITS

        self._wire = httpx2.AsyncHTTPTransport(limits=DEFAULT_CONNECTION_LIMITS)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        due = NOT_BEFORE.get()
        if due is None:
            return await self._wire.handle_async_request(request)
        if (delay := due - time.time()) > 0:
            await asyncio.sleep(delay)
        late = time.time() - due
        if late > conf.MODEL_LIMIT_JITTER_SECONDS / 2:
            return _slot_missed(request, late)
        response = await self._wire.handle_async_request(request)
        if response.status_code >= 400:
            response.headers["x-should-retry"] = "false"
        return response

    async def aclose(self) -> None:
        await self._wire.aclose()


SLOT_MISSED = "slot_missed"


def _slot_missed(request: httpx2.Request, late: float) -> httpx2.Response:
    message = f"not sent: {late:.2f} s after its rate-limit slot (a new slot is taken)"
    return httpx2.Response(
        429,
        headers={"x-should-retry": "false"},
        json={"error": {"message": message, "type": "requests", "code": SLOT_MISSED}},
        request=request,
    )


def endpoint() -> str:
    """The base URL without any user:password part, safe to put in an error message."""
    parts = urlsplit(conf.OPENAI_BASE_URL)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def request_options() -> dict[str, Any]:
    """OPENAI_REQUEST_OPTIONS as a dict (e.g. `{"temperature": 0, "max_tokens": 1024}`)."""
    raw = conf.OPENAI_REQUEST_OPTIONS
    if isinstance(raw, dict):
        options = dict(raw)
    elif not raw.strip():
        return {}
    else:
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelError(
                f"OPENAI_REQUEST_OPTIONS is not valid JSON: {exc}", retryable=False
            ) from None
    if not isinstance(options, dict):
        raise ModelError("OPENAI_REQUEST_OPTIONS must be a JSON object", retryable=False)
    for owned in OWNED_FIELDS:
        options.pop(owned, None)
    return options
