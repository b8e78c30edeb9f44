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
from collections.abc import AsyncIterator, Callable, Iterator
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
    and what the engine recorded for a tool call (`tool_content`: call id -> the content, None
    for a call the engine has no step of)."""

    policy: Callable[..., ScriptedTurn] | None
    instructions: str = ""
    tool_content: Callable[[str], str | None] = field(default=lambda call_id: None)
    # the conversation converted so far: a run's requests carry its history again each time, so
    # each message is converted once (`engine_messages`)
    converted: _Converted | None = None


@dataclass
class _Converted:
    """The engine form of a conversation's first messages (`sources`: those messages, in order;
    held, not their ids: a message freed and another made at its address would match an id)."""

    sources: list[ModelMessage] = field(default_factory=list)
    out: list[dict] = field(default_factory=list)  # after the system message
    tokens: list[int] = field(default_factory=list)  # estimate_tokens of each of `out`
    system: list[str] = field(default_factory=list)


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


def _tool_message(part: Any, recorded: Callable[[str], str | None]) -> dict:
    call_id = part.tool_call_id or ""
    content = recorded(call_id)
    if content is None:  # not a step of this run's journal: as Pydantic AI says it
        if isinstance(part, RetryPromptPart):
            content = _dumps({"error": part.model_response()})
        elif part.outcome == "denied":
            content = _dumps({"error": "rejected", "reason": part.content})
        else:
            content = _dumps(part.content)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def engine_messages(messages: list[ModelMessage], playing_: Playing) -> list[dict]:
    """The conversation in the engine's form (see the module's docstring). The messages already
    converted for this run (the same objects, in the same order) are not converted again."""
    done = playing_.converted
    if done is None or not _continues(messages, done.sources):
        done = playing_.converted = _Converted()
    recorded = playing_.tool_content
    out, system = done.out, done.system
    for message in messages[len(done.sources) :]:
        start = len(out)
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
        done.tokens.extend(estimate_tokens(str(m.get("content") or "")) for m in out[start:])
        done.sources.append(message)
    head = playing_.instructions or ("\n\n".join(system) if system else "")
    return [{"role": "system", "content": head}, *out]


def _continues(messages: list[ModelMessage], sources: list[ModelMessage]) -> bool:
    """`messages` begin with the messages `sources` holds (a conversation that grew)."""
    return len(sources) <= len(messages) and all(
        message is source for message, source in zip(messages, sources, strict=False)
    )


def _prompt_tokens(messages: list[ModelMessage], playing_: Playing) -> int:
    """The estimate of the conversation's tokens (engine form), from its conversion."""
    converted = engine_messages(messages, playing_)
    done = playing_.converted
    return estimate_tokens(converted[0]["content"] or "") + sum(done.tokens)


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
        prompt = _prompt_tokens(messages, _playing.get() or Playing(policy=None))
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        calls = sum(1 for p in response.parts if isinstance(p, ToolCallPart))
        return RequestUsage(input_tokens=prompt, output_tokens=estimate_tokens(text) + 10 * calls)


_model: ScriptedModel | None = None


def scripted_model() -> ScriptedModel:
    global _model
    if _model is None:
        _model = ScriptedModel()
    return _model
