"""The offline default model: a Pydantic AI `FunctionModel` that plays the agent's policy.

Each turn asks the agent's `scripted_policy(messages)` what a plausible model would do next,
so a demo agent behaves like a real support agent without any network; same conversation in,
same turn out, which is what makes a resumed run indistinguishable from an uninterrupted one.
A policy reads the conversation in the engine's form (OpenAI-style dicts: `messages[0]` the
instructions, `messages[1]` the run's input, then one assistant message per model turn and one
tool message per call), converted here from the Pydantic AI messages of the request; a tool
message says what the engine recorded for the call's step when it knows the step (its result,
the rejection with its reason, the refusal or error fed back), as the engine always showed it.

Streamed (a delay or a latency configured) it yields the turn's text a token at a time, then its
calls; otherwise it answers the whole turn at once (`Model.request`), one text part per token.
The usage it reports is the engine's estimate of the conversation and the turn (`usage_for`),
which token budgets and the prices of `scripted` runs are written against.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.usage import RequestUsage

from agentruns.conf import conf
from agentruns.registry import ScriptedTurn

_TOKEN = re.compile(r"\S+\s*|\s+")


@dataclass
class Playing:
    """What the scripted model needs of the run it plays: the agent's policy and instructions,
    and what the engine recorded for the tool calls (`tool_contents`: call id -> the content)."""

    policy: Callable[..., ScriptedTurn] | None
    instructions: str = ""
    tool_contents: Callable[[], Mapping[str, str]] = field(default=lambda: {})


_playing: ContextVar[Playing | None] = ContextVar("agentruns_scripted_playing", default=None)


@contextmanager
def playing(what: Playing) -> Iterator[None]:
    token = _playing.set(what)
    try:
        yield
    finally:
        _playing.reset(token)


def _default_policy(messages: list[dict]) -> ScriptedTurn:
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return ScriptedTurn(text=f"Received: {last_user['content'] if last_user else ''}")


@functools.cache
def _wants_tools(policy: Callable[..., ScriptedTurn]) -> bool:
    try:
        return "tools" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False


def _raw(args: dict | str) -> str:
    return args if isinstance(args, str) else json.dumps(args)  # str: deliberately bad JSON


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _tool_message(part: Any, recorded: Mapping[str, str]) -> dict:
    call_id = part.tool_call_id or ""
    content = recorded.get(call_id)
    if content is None:  # not a step of this run's journal: as Pydantic AI says it
        if isinstance(part, RetryPromptPart):
            content = _dumps({"error": part.model_response()})
        elif part.outcome == "denied":
            content = _dumps({"error": "rejected", "reason": part.content})
        else:
            content = _dumps(part.content)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def engine_messages(messages: list[ModelMessage], playing_: Playing) -> list[dict]:
    """The conversation in the engine's form (see the module's docstring)."""
    out: list[dict] = [{"role": "system", "content": playing_.instructions}]
    system: list[str] = []
    recorded = playing_.tool_contents()
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    system.append(part.content)
                elif isinstance(part, UserPromptPart):
                    text = part.content if isinstance(part.content, str) else str(part.content)
                    out.append({"role": "user", "content": text})
                elif isinstance(part, ToolReturnPart | RetryPromptPart) and (
                    not isinstance(part, RetryPromptPart) or part.tool_name
                ):
                    out.append(_tool_message(part, recorded))
                elif isinstance(part, RetryPromptPart):
                    out.append({"role": "user", "content": part.model_response()})
            if not playing_.instructions and message.instructions:
                system.append(message.instructions)
        elif isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
            turn: dict = {"role": "assistant", "content": text or None}
            if calls:
                turn["tool_calls"] = [
                    {
                        "id": call.tool_call_id,
                        "type": "function",
                        "function": {"name": call.tool_name, "arguments": _raw(call.args or {})},
                    }
                    for call in calls
                ]
            out.append(turn)
    if system and not playing_.instructions:
        out[0]["content"] = "\n\n".join(system)
    return out


class ScriptedModel(FunctionModel):
    """One per process: what it plays comes from the run in progress (`playing`)."""

    def __init__(self) -> None:
        super().__init__(self._answer, stream_function=self._play, model_name="scripted")

    @property
    def waits(self) -> bool:
        """A delay or a latency configured: the model keeps the run waiting, and streams."""
        return bool(conf.SCRIPTED_MODEL_LATENCY_MS or conf.SCRIPTED_MODEL_DELAY_MS)

    @staticmethod
    def _turn(messages: list[ModelMessage], info: AgentInfo) -> tuple[ScriptedTurn, int]:
        playing_ = _playing.get() or Playing(policy=None)
        converted = engine_messages(messages, playing_)
        policy = playing_.policy or _default_policy
        if _wants_tools(policy):
            turn = policy(converted, tools=[t.name for t in info.function_tools])
        else:
            turn = policy(converted)
        return turn, len(converted)

    async def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn, position = self._turn(messages, info)
        parts: list[TextPart | ToolCallPart] = [TextPart(t) for t in _TOKEN.findall(turn.text)]
        for i, (name, args) in enumerate(turn.tool_calls):
            parts.append(ToolCallPart(name, _raw(args), tool_call_id=f"call_{position}_{i}"))
        return ModelResponse(parts=parts, usage=RequestUsage(output_tokens=1))

    async def _play(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        turn, position = self._turn(messages, info)
        latency = conf.SCRIPTED_MODEL_LATENCY_MS / 1000.0
        delay = conf.SCRIPTED_MODEL_DELAY_MS / 1000.0
        tokens = _TOKEN.findall(turn.text)
        if latency:
            await asyncio.sleep(latency)
        for token in tokens:
            if delay:
                await asyncio.sleep(delay)
            yield token
        for i, (name, args) in enumerate(turn.tool_calls):
            yield {
                i: DeltaToolCall(
                    name=name, json_args=_raw(args), tool_call_id=f"call_{position}_{i}"
                )
            }
        if not tokens and not turn.tool_calls:
            yield ""  # an empty turn (a FunctionModel stream must yield something)

    @staticmethod
    def usage_for(messages: list[ModelMessage], response: ModelResponse) -> RequestUsage:
        """The engine's estimate: each message of the conversation (engine form) and the turn."""
        converted = engine_messages(messages, _playing.get() or Playing(policy=None))
        prompt = sum(estimate_tokens(str(m.get("content") or "")) for m in converted)
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        calls = sum(1 for p in response.parts if isinstance(p, ToolCallPart))
        return RequestUsage(input_tokens=prompt, output_tokens=estimate_tokens(text) + 10 * calls)


_model: ScriptedModel | None = None


def scripted_model() -> ScriptedModel:
    global _model
    if _model is None:
        _model = ScriptedModel()
    return _model
