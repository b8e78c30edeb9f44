"""One model request the way the engine's model unit makes it (runtime/engine/model/request.py),
without a run: `request_model` (the unit's body: streamed when the model can, else asked whole)
as a task of the process's stream loop (`stream_pump.run_streaming`), its text deltas handed to
the caller or to its `TextSink`, and what it raises classified as the unit classifies it
(`model_unit._classified`: a `ModelError`, an outage or a verdict)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from agentruns.runtime.engine.model.request import _classified, request_model
from agentruns.runtime.providers import TextSink
from agentruns.runtime.providers.stream_pump import SinkFailed, run_streaming


@dataclass
class Params:
    """What the model unit's body reads of pydantic-ai's `ModelRequestParams`."""

    messages: list[ModelMessage]
    model_settings: Any = None
    model_request_parameters: ModelRequestParameters = field(default_factory=ModelRequestParameters)


def params(
    messages: list[ModelMessage], tools: Sequence[ToolDefinition] = (), settings: Any = None
) -> Params:
    return Params(
        messages=messages,
        model_settings=settings,
        model_request_parameters=ModelRequestParameters(
            function_tools=list(tools), allow_text_output=True
        ),
    )


def conversation(openai_messages: list[dict]) -> list[ModelMessage]:
    """OpenAI-style messages as the Pydantic AI messages a run's loop sends for them."""
    out: list[ModelMessage] = []
    parts: list[Any] = []
    names: dict[str, str] = {}
    for message in openai_messages:
        role = message["role"]
        if role == "system":
            parts.append(SystemPromptPart(message["content"]))
        elif role == "user":
            parts.append(UserPromptPart(message["content"]))
        elif role == "tool":
            call_id = message["tool_call_id"]
            parts.append(ToolReturnPart(names[call_id], message["content"], call_id))
        else:
            if parts:
                out.append(ModelRequest(parts=parts))
                parts = []
            answer: list[Any] = [TextPart(message["content"])] if message.get("content") else []
            for call in message.get("tool_calls") or ():
                names[call["id"]] = call["function"]["name"]
                answer.append(
                    ToolCallPart(
                        call["function"]["name"], call["function"]["arguments"], call["id"]
                    )
                )
            out.append(ModelResponse(parts=answer))
    if parts:
        out.append(ModelRequest(parts=parts))
    return out


def stream(
    model: Model, request: Params, sink: TextSink | None = None
) -> Generator[str, None, ModelResponse]:
    """Yield the text deltas `sink` does not take, then return the model's response."""
    deltas = run_streaming(lambda: request_model(model, request, None), sink or TextSink())
    try:
        return (yield from deltas)
    except SinkFailed as failed:
        raise failed.error from None
    except Exception as exc:
        raise _classified(model, exc) from exc
    finally:
        deltas.close()


def ask(model: Model, request: Params) -> tuple[list[str], ModelResponse]:
    """(the text deltas, the response) of one request."""
    deltas: list[str] = []
    chunks = stream(model, request)
    try:
        while True:
            deltas.append(next(chunks))
    except StopIteration as end:
        return deltas, end.value
