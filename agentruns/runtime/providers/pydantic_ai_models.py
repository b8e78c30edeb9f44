"""Every model Pydantic AI speaks, as a provider of the engine (one model step per request).

`AGENTRUNS_MODEL` (or an agent's own model) may be any Pydantic AI model name (`openai:gpt-4o`,
`anthropic:...`, `google-gla:...`, `groq:...`, `mistral:...`, `bedrock:...`, `ollama:...`), and
a Pydantic AI agent may bring its own `Model` instance (a `FunctionModel` offline). `openai:`
names go to `OPENAI_BASE_URL` (any OpenAI-compatible server) with `OPENAI_API_KEY`; the others
read their provider's own environment variables, as Pydantic AI does.

The request is streamed with `pydantic_ai.direct.model_request_stream_sync` on the executor
thread's event loop; text deltas go out as they arrive (the executor batches them into events),
tool calls and usage at the end. The SDK's own retries are off: a retryable error (429, 5xx, a
broken connection or stream) is an outage the engine backs off from (runtime/outages/model_outage.py);
the rest fail the run with the reason.

The conversation arrives as the engine's (OpenAI-style) messages rebuilt from the steps and is
converted to Pydantic AI messages incrementally (each turn converts only its new messages).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic_ai import exceptions as pa_errors
from pydantic_ai.direct import model_request, model_request_stream_sync
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.messages import (
    ModelRequest as PAModelRequest,
)
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.tools import ToolDefinition

from agentruns.conf import conf
from agentruns.registry.pydantic_agents.calls import run_sync
from agentruns.runtime.providers.base import ModelError, ModelRequest, TextDelta, ToolCall, Usage

OPENAI_PREFIXES = ("openai:", "openai-chat:")


def build_model(name: str) -> Model:
    """A Pydantic AI model for a model name; ModelError (fatal) when it cannot be built."""
    try:
        if name.startswith(OPENAI_PREFIXES):
            from openai import AsyncOpenAI
            from pydantic_ai.models.openai import OpenAIChatModel
            from pydantic_ai.providers.openai import OpenAIProvider

            client = AsyncOpenAI(
                base_url=conf.OPENAI_BASE_URL,
                api_key=conf.OPENAI_API_KEY or "unset",
                max_retries=0,  # the engine retries, as attempts
                timeout=conf.OPENAI_TIMEOUT_SECONDS or None,
            )
            return OpenAIChatModel(
                name.split(":", 1)[1], provider=OpenAIProvider(openai_client=client)
            )
        return infer_model(name)
    except Exception as exc:  # unknown provider, missing SDK or key
        raise ModelError(f"cannot use model {name!r}: {exc}", retryable=False) from exc


def model_error(exc: Exception) -> ModelError:
    """Retryable (rate limit, server error, connection, broken stream: an outage the run backs
    off from, runtime/outages/model_outage.py, honouring the provider's Retry-After) or fatal, with the
    reason."""
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(exc, pa_errors.ModelHTTPError):
        status = exc.status_code
        body = str(exc.body or "")[:500]
        if status == 429 and "insufficient_quota" not in body:
            return ModelError(
                f"rate limited (HTTP 429): {body}", retryable=True, retry_after=retry_after
            )
        if status >= 500 or status in (408, 409):
            return ModelError(
                f"model server error (HTTP {status}): {body}",
                retryable=True,
                retry_after=retry_after,
            )
        return ModelError(f"model request refused (HTTP {status}): {body}", retryable=False)
    if isinstance(exc, pa_errors.ModelAPIError | pa_errors.UnexpectedModelBehavior):
        return ModelError(f"model unavailable: {exc}", retryable=True, retry_after=retry_after)
    if isinstance(exc, OSError | TimeoutError):
        return ModelError(f"model unreachable: {exc!r}", retryable=True)
    return ModelError(f"model error: {exc!r}", retryable=False)


def _tool_result(message: dict, tool_name: str) -> ToolReturnPart:
    call_id = message.get("tool_call_id") or ""
    try:
        payload: Any = json.loads(message.get("content") or "null")
    except ValueError:
        payload = message.get("content")
    if isinstance(payload, dict) and payload.get("error") == "rejected" and "reason" in payload:
        # a rejection in the inbox is Pydantic AI's ToolDenied: the tool's answer is the reason
        return ToolReturnPart(tool_name=tool_name, content=payload["reason"], tool_call_id=call_id)
    if isinstance(payload, dict) and "error" in payload and set(payload) <= {"error", "retry"}:
        # a failed call (bad arguments, ModelRetry, ToolFailed): the model is asked to retry
        return ToolReturnPart(
            tool_name=tool_name,
            content=str(payload["error"]),
            tool_call_id=call_id,
            outcome="retried",
        )
    return ToolReturnPart(tool_name=tool_name, content=payload, tool_call_id=call_id)


class _Converted:
    """Engine messages -> Pydantic AI messages, kept across the turns of one executor pass."""

    def __init__(self) -> None:
        self.source: list[dict] | None = None
        self.done = 0  # source[:done] are in `prefix`
        self.prefix: list[ModelMessage] = []
        self.names: dict[str, str] = {}  # tool call id -> tool name

    def messages(self, source: list[dict]) -> list[ModelMessage]:
        if source is not self.source or len(source) < self.done:
            self.__init__()
            self.source = source
        parts: list[Any] = []
        for position in range(self.done, len(source)):
            message = source[position]
            role = message.get("role")
            if role == "assistant":
                if parts:
                    self.prefix.append(PAModelRequest(parts=parts))
                    parts = []
                self.prefix.append(self._response(message))
                self.done = position + 1
            elif role == "system":
                parts.append(SystemPromptPart(content=message.get("content") or ""))
            elif role == "user":
                parts.append(UserPromptPart(content=message.get("content") or ""))
            elif role == "tool":
                name = self.names.get(message.get("tool_call_id") or "", "")
                parts.append(_tool_result(message, name))
        return self.prefix + ([PAModelRequest(parts=parts)] if parts else [])

    def _response(self, message: dict) -> ModelResponse:
        parts: list[Any] = []
        if message.get("content"):
            parts.append(TextPart(content=message["content"]))
        for call in message.get("tool_calls") or ():
            function = call["function"]
            self.names[call["id"]] = function["name"]
            parts.append(
                ToolCallPart(
                    tool_name=function["name"],
                    args=function.get("arguments") or "{}",
                    tool_call_id=call["id"],
                )
            )
        return ModelResponse(parts=parts)


def _tool_definitions(tools: list[dict]) -> list[ToolDefinition]:
    return [
        ToolDefinition(
            name=t["function"]["name"],
            description=t["function"].get("description") or None,
            parameters_json_schema=t["function"].get("parameters") or {"type": "object"},
        )
        for t in tools
    ]


class PydanticAIProvider:
    """One per executor pass (`get_provider`)."""

    waits = True  # a real model keeps us waiting: the executor lends its connection back
    # True for a model that never waits (an offline function): it is asked without streaming
    # (`model_request` on this thread's event loop) and its text parts are handed on in order;
    # a streamed request costs ~0.5 ms of CPU more (the sync bridge's loop, a lock and a cancel
    # scope per event), for deltas that would all arrive at once anyway
    instant = False

    def __init__(self, model: Model | str, settings: dict | None = None) -> None:
        self._model = model
        self.settings = settings
        self._messages = _Converted()

    @property
    def model(self) -> Model:
        if isinstance(self._model, str):
            self._model = build_model(self._model)
        return self._model

    def stream(self, request: ModelRequest) -> Iterator[TextDelta | ToolCall | Usage]:
        messages = self._messages.messages(request.messages)
        params = ModelRequestParameters(
            function_tools=_tool_definitions(request.tools), allow_text_output=True
        )
        options: dict[str, Any] = {
            "model_settings": self.settings,
            "model_request_parameters": params,
            "instrument": False,
        }
        try:
            if self.instant:  # nothing to wait for: the answer, as the model's parts
                response = run_sync(model_request(self.model, messages, **options))
                for part in response.parts:
                    if isinstance(part, TextPart) and part.content:
                        yield TextDelta(part.content)
            else:
                with model_request_stream_sync(self.model, messages, **options) as stream:
                    for event in stream:
                        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                            if event.part.content:
                                yield TextDelta(event.part.content)
                        elif isinstance(event, PartDeltaEvent) and isinstance(
                            event.delta, TextPartDelta
                        ):
                            if event.delta.content_delta:
                                yield TextDelta(event.delta.content_delta)
                    response = stream.response
        except ModelError:
            raise
        except Exception as exc:
            raise model_error(exc) from exc
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                # the arguments as the model produced them: args_as_json_str() would rewrite
                # malformed JSON into a valid {"INVALID_JSON": ...} the engine cannot tell apart
                raw = part.args if isinstance(part.args, str) else part.args_as_json_str()
                yield ToolCall(id=part.tool_call_id, name=part.tool_name, arguments=raw)
        yield Usage(
            prompt_tokens=response.usage.input_tokens or 0,
            completion_tokens=response.usage.output_tokens or 0,
        )
