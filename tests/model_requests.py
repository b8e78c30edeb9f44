"""One model request the way the engine's model unit makes it (runtime/engine/model/unit.py),
without a run: `request_model` (the unit's body: streamed when the model can, else asked whole)
as a task of the process's run loop (`engine/lanes.py`), its text deltas relayed to the caller
as they come, and what it raises classified as the unit classifies it (`_classified`: a
`ModelError`, an outage or a verdict)."""

from __future__ import annotations

import queue
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

from agentruns.runtime.engine.lanes import run_on_process_loop
from agentruns.runtime.engine.model.unit import _classified, delivering, request_model


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


class _Relay:
    """The request's deltas, handed from its task to the caller's thread."""

    def __init__(self, take: Any = None) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.take = take

    async def deliver(self, text: str) -> None:
        if self.take is not None:
            self.take(text)
        self.queue.put(text)


_END = object()


def stream(model: Model, request: Params, take: Any = None) -> Generator[str, None, ModelResponse]:
    """Yield the text deltas as they come, then return the model's response. `take(text)` is
    called with each delta inside the request's task (what it raises ends the request)."""
    relay = _Relay(take)

    async def request_it() -> ModelResponse:
        with delivering(relay):
            return await request_model(model, request, None)

    done = run_on_process_loop(request_it())
    done.add_done_callback(lambda _: relay.queue.put(_END))
    try:
        while (text := relay.queue.get()) is not _END:
            yield text
        try:
            return done.result()
        except Exception as exc:
            raise _classified(model, exc) from exc
    finally:
        if not done.done():  # the caller stopped early: the request's task is cancelled
            done.cancel()
            try:
                done.result(timeout=5)
            except BaseException:  # noqa: BLE001 - its end is the cancellation
                pass


def ask(model: Model, request: Params) -> tuple[list[str], ModelResponse]:
    """(the text deltas, the response) of one request."""
    deltas: list[str] = []
    chunks = stream(model, request)
    try:
        while True:
            deltas.append(next(chunks))
    except StopIteration as end:
        return deltas, end.value
