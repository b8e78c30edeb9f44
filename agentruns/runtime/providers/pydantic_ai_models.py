"""Every model Pydantic AI speaks, as a provider of the engine (one model step per request).

`AGENTRUNS_MODEL` (or an agent's own model) may be any Pydantic AI model name (`openai:gpt-4o`,
`anthropic:...`, `google:...` (`google-gla:`), `groq:...`, `mistral:...`, `bedrock:...`,
`ollama:...`; registry/model_names.py), `openai/<name>` as before, and a Pydantic AI agent may
bring its own `Model` instance (a `FunctionModel` offline). `openai:` and `openai/` names go to
OPENAI_BASE_URL (any OpenAI-compatible server, openai_compatible.py); the others read their
provider's own environment variables, as Pydantic AI does.

The request is streamed with `pydantic_ai.direct.model_request_stream`, consumed by one task on
the process's stream loop (stream_pump.py); text deltas go out as they arrive (yielded,
or handed to the caller's `TextSink` inside that task: the executor's delta feed), tool calls
and usage at the end. Failures are classified by model_errors.py: an outage the engine
backs off from (runtime/outages/model_outage.py), or a verdict that fails the run with the reason.

The conversation arrives as the engine's (OpenAI-style) messages rebuilt from the steps and is
converted to Pydantic AI messages incrementally (each turn converts only its new messages).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

from pydantic_ai.direct import model_request_stream
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.messages import (
    ModelRequest as PAModelRequest,
)
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.tools import ToolDefinition

from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime.providers import openai_compatible
from agentruns.runtime.providers.base import (
    ModelError,
    ModelRequest,
    TextDelta,
    TextSink,
    ToolCall,
    Usage,
)
from agentruns.runtime.providers.model_errors import model_error
from agentruns.runtime.providers.stream_pump import (
    SinkFailed,
    answer_now,
    stream_deltas,
    stream_loop,
)


def build_model(name: str) -> Model:
    """A Pydantic AI model for a model name; ModelError (fatal) when it cannot be built (an SDK
    extra, a key or a base URL missing: registration and start-up refuse the first already)."""
    resolved = pydantic_ai_name(name)
    try:
        if resolved.startswith(openai_compatible.PREFIXES):
            return openai_compatible.openai_model(resolved)
        return infer_model(resolved)
    except Exception as exc:  # unknown provider, missing SDK or key
        raise ModelError(f"cannot use model {name!r}: {exc}", retryable=False) from exc


def _arguments(part: ToolCallPart) -> str:
    """The call's arguments as the model produced them: broken JSON stays broken (the engine
    feeds the parse error back), where `args_as_json_str` would wrap it as INVALID_JSON."""
    if isinstance(part.args, str):
        return part.args
    return json.dumps(part.args or {})


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


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


_BUILT: set[tuple[int, str]] = set()  # (pid, model name) built on the stream loop: prepare()


class PydanticAIProvider:
    """One per executor pass (`get_provider`)."""

    waits = True  # a real model keeps us waiting: the executor lends its connection back
    # True for a model that never waits (an offline function): it is asked without streaming
    # (`Model.request`, run eagerly: stream_pump.answer_now) and its text parts are handed on;
    # a streamed request costs more CPU (stream events, the hand-over to sync code), for deltas
    # that would all arrive at once anyway; `Model.request` is called directly: `model_request`'s
    # preparation (instrumentation, retry-part and instruction scans) finds nothing to do here
    instant = False

    def __init__(self, model: Model | str, settings: dict | None = None) -> None:
        self._model = model
        self.settings = settings
        self._messages = _Converted()
        # (the engine's tool schemas, their request parameters): a slice offers the same tools
        # (one list) every turn, so the parameters are built once per pass, not once per turn
        self._params: tuple[list[dict], ModelRequestParameters] | None = None
        self._openai = isinstance(model, str) and pydantic_ai_name(model).startswith(
            openai_compatible.PREFIXES
        )
        # its client waits for a rate-limit slot at the wire (openai_compatible._SlottedWire)
        self.precise_start = self._openai

    @property
    def model(self) -> Model:
        if isinstance(self._model, str):
            self._model = build_model(self._model)
        return self._model

    def prepare(self) -> None:
        """Build the model where it streams (the process's stream loop, whose thread keeps the
        clients) before a request waits for its rate-limit slot: a process's first request
        would otherwise spend ~0.1-0.4 s building it between its slot and the wire. Once per
        process and model: after that it is a lookup (and the loop is not disturbed)."""
        built = (os.getpid(), self._model)
        if not isinstance(self._model, str) or self.instant or built in _BUILT:
            return

        async def build() -> Model:
            return self.model

        loop, _ = stream_loop()
        asyncio.run_coroutine_threadsafe(build(), loop).result()
        _BUILT.add(built)

    def _settings(self) -> dict | None:
        if not self._openai:
            return self.settings
        options = openai_compatible.request_options()
        if not options:
            return self.settings
        settings = dict(self.settings or {})
        settings["extra_body"] = {**options, **(settings.get("extra_body") or {})}
        return settings

    def _request_parameters(self, tools: list[dict]) -> ModelRequestParameters:
        if self._params is None or self._params[0] is not tools:
            params = ModelRequestParameters(
                function_tools=_tool_definitions(tools), allow_text_output=True
            )
            self._params = (tools, params)
        return self._params[1]

    def stream(
        self, request: ModelRequest, sink: TextSink | None = None
    ) -> Iterator[TextDelta | ToolCall | Usage]:
        messages = self._messages.messages(request.messages)
        params = self._request_parameters(request.tools)
        settings = self._settings()
        try:
            if self.instant:  # nothing to wait for: the answer, as the model's parts
                response = answer_now(self.model.request(messages, settings, params))
                for part in response.parts:
                    if isinstance(part, TextPart) and part.content:
                        yield TextDelta(part.content)
            else:
                deltas = stream_deltas(
                    lambda: model_request_stream(
                        self.model,
                        messages,
                        model_settings=settings,
                        model_request_parameters=params,
                        instrument=False,
                    ),
                    sink,
                )
                try:
                    while True:
                        yield TextDelta(next(deltas))
                except StopIteration as end:
                    response = end.value
                finally:
                    deltas.close()  # the caller stopped early: the stream's task is cancelled
        except SinkFailed as failed:
            raise failed.error from None  # the caller's own error (a lost lease), not the model's
        except ModelError:
            raise
        except Exception as exc:
            raise model_error(exc, openai_compatible.endpoint() if self._openai else None) from exc
        calls = [part for part in response.parts if isinstance(part, ToolCallPart)]
        for part in calls:
            yield ToolCall(id=part.tool_call_id, name=part.tool_name, arguments=_arguments(part))
        usage = Usage(
            prompt_tokens=response.usage.input_tokens or 0,
            completion_tokens=response.usage.output_tokens or 0,
        )
        if not (usage.prompt_tokens or usage.completion_tokens):
            # a server that reports no usage: estimate, so the token and cost budgets still work
            usage = Usage(
                prompt_tokens=sum(
                    _estimate_tokens(str(m.get("content") or "")) for m in request.messages
                ),
                completion_tokens=_estimate_tokens(
                    "".join(p.content for p in response.parts if isinstance(p, TextPart))
                )
                + sum(_estimate_tokens(_arguments(part)) for part in calls),
            )
        yield usage
