"""The offline default model: a Pydantic AI `FunctionModel` that streams token by token.

Each turn asks the agent's `scripted_policy(messages)` what a plausible model would do next, so
a demo agent behaves like a real support agent without any network. Same conversation in, same
turn out, which is what makes a resumed run indistinguishable from an uninterrupted one.

The request goes the way of every Pydantic AI model (`PydanticAIProvider`: the conversation
converted to Pydantic AI messages, then `model_request_stream` and its stream events): the
stream function yields the turn's text a token at a time (SCRIPTED_MODEL_DELAY_MS apart), then
its tool calls as `DeltaToolCall`s. With no delay configured there is nothing to wait for, so the
provider is `instant`: the FunctionModel's function answers the whole turn at once, one text part
per token (the same deltas), through `FunctionModel.request`, at a fraction of the CPU.
A policy reads the conversation in the engine's form (OpenAI-style dicts, the form policies are
written against: `messages[1]` is the run's input), which is the form the Pydantic AI messages
of this request were converted from; the tools it is told of are the ones Pydantic AI offers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from agentruns.conf import conf
from agentruns.registry import ScriptedTurn
from agentruns.runtime.providers.base import ModelRequest, TextDelta, TextSink, ToolCall, Usage
from agentruns.runtime.providers.pydantic_ai_models import PydanticAIProvider

_TOKEN = re.compile(r"\S+\s*|\s+")


def _default_policy(messages: list[dict]) -> ScriptedTurn:
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return ScriptedTurn(text=f"Received: {last_user['content'] if last_user else ''}")


def _raw(args: dict | str) -> str:
    return args if isinstance(args, str) else json.dumps(args)  # str: deliberately bad JSON


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


@functools.cache
def _wants_tools(policy: Callable[..., ScriptedTurn]) -> bool:
    """A policy that takes `tools` is told which tools this turn offers, as a real model is."""
    try:
        return "tools" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False


class _ScriptedModel(FunctionModel):
    """The scripted model's FunctionModel, preparing a request's settings and parameters once
    for the same pair: Pydantic AI prepares them anew in every `request` (merging settings,
    copying the parameters dataclass three times: ~13 us a turn, the largest part of an instant
    turn's CPU), and the provider sends the same pair every turn of a pass. The prepared pair
    is only read (by `request` and the AgentInfo it builds), never changed."""

    _prepared: tuple[object, object, tuple[Any, ModelRequestParameters]] | None = None

    def prepare_request(
        self, model_settings: ModelSettings | None, model_request_parameters: ModelRequestParameters
    ) -> tuple[ModelSettings | None, ModelRequestParameters]:
        kept = self._prepared
        if kept is not None and kept[0] is model_settings and kept[1] is model_request_parameters:
            return kept[2]
        prepared = super().prepare_request(model_settings, model_request_parameters)
        self._prepared = (model_settings, model_request_parameters, prepared)
        return prepared


class ScriptedProvider(PydanticAIProvider):
    """One per executor pass (`get_provider`), which sends one growing conversation."""

    def __init__(self) -> None:
        super().__init__(
            _ScriptedModel(self._answer, stream_function=self._play, model_name="scripted")
        )
        # SCRIPTED_MODEL_LATENCY_MS before each turn's first token (a real model's time to first
        # token), SCRIPTED_MODEL_DELAY_MS between tokens; with neither it answers instantly
        self.latency = conf.SCRIPTED_MODEL_LATENCY_MS / 1000.0
        self.delay = conf.SCRIPTED_MODEL_DELAY_MS / 1000.0
        # the executor gives its database connection back while a model keeps it waiting
        self.waits = bool(self.latency or self.delay)
        self.instant = not self.waits
        self._request: ModelRequest | None = None  # the engine's request being played
        self._turn: ScriptedTurn | None = None
        self._policy_error: Exception | None = None
        # (the conversation's first message, messages counted, their tokens): the executor only
        # appends, so each turn counts its new messages only (a full recount made a long run's
        # steps slower and slower: O(n) per turn)
        self._counted: tuple[object, int, int] | None = None

    def _decide(self, request: ModelRequest, offered: list[str]) -> ScriptedTurn:
        policy = getattr(request.agent, "scripted_policy", None) or _default_policy
        if _wants_tools(policy):
            return policy(request.messages, tools=offered)
        return policy(request.messages)

    def _turn_for(self, info: AgentInfo) -> tuple[ScriptedTurn, list[str], int]:
        """The policy's turn for the request being played, its tokens and the call ids' base."""
        request = self._request
        assert request is not None, "the scripted model is driven through stream()"
        try:
            turn = self._decide(request, [t.name for t in info.function_tools])
        except Exception as exc:  # the policy's own bug, not a model outage: raised as it is
            self._policy_error = exc
            raise
        self._turn = turn
        return turn, _TOKEN.findall(turn.text), len(request.messages)

    async def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """The FunctionModel's function (no delay configured): the whole turn at once, its text
        as one part per token (the deltas a streamed turn would have had), then its calls."""
        turn, tokens, position = self._turn_for(info)
        parts: list[TextPart | ToolCallPart] = [TextPart(token) for token in tokens]
        for i, (name, args) in enumerate(turn.tool_calls):
            parts.append(ToolCallPart(name, _raw(args), tool_call_id=f"call_{position}_{i}"))
        # a usage of its own spares FunctionModel its estimate (replaced in stream() anyway)
        return ModelResponse(parts=parts, usage=RequestUsage(output_tokens=len(tokens) or 1))

    async def _play(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        """The FunctionModel's stream function: the turn's text a token at a time (after the
        configured latency, each token after the delay), then its calls."""
        turn, tokens, position = self._turn_for(info)
        if self.latency:
            await asyncio.sleep(self.latency)
        for token in tokens:
            if self.delay:
                await asyncio.sleep(self.delay)
            yield token
        for i, (name, args) in enumerate(turn.tool_calls):
            yield {
                i: DeltaToolCall(
                    name=name, json_args=_raw(args), tool_call_id=f"call_{position}_{i}"
                )
            }
        if not tokens and not turn.tool_calls:
            yield ""  # an empty turn (a FunctionModel stream must yield something)

    def _prompt_tokens(self, messages: list[dict]) -> int:
        first, count, tokens = self._counted or (None, 0, 0)
        if not messages or messages[0] is not first or len(messages) < count:
            count, tokens = 0, 0
        tokens += sum(_estimate_tokens(str(m.get("content") or "")) for m in messages[count:])
        self._counted = (messages[0] if messages else None, len(messages), tokens)
        return tokens

    def stream(
        self, request: ModelRequest, sink: TextSink | None = None
    ) -> Iterator[TextDelta | ToolCall | Usage]:
        self._request, self._turn, self._policy_error = request, None, None
        try:
            for item in super().stream(request, sink):
                if not isinstance(item, Usage):
                    yield item
        except Exception:
            if self._policy_error is not None:
                raise self._policy_error from None
            raise
        turn = self._turn or ScriptedTurn()
        # the engine's estimate (FunctionModel's own counts words and adds a fixed 50 to every
        # request): token budgets and prices of `scripted` runs are written against this one
        yield Usage(
            prompt_tokens=self._prompt_tokens(request.messages),
            completion_tokens=_estimate_tokens(turn.text) + 10 * len(turn.tool_calls),
        )
