"""The offline default model: deterministic, streams token by token.

It asks the agent's `scripted_policy(messages)` what a plausible model would do next, so a demo
agent behaves like a real support agent without any network. Same conversation in, same turn out,
which is what makes a resumed run indistinguishable from an uninterrupted one.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import time
from collections.abc import Callable, Iterator

from agentruns.conf import conf
from agentruns.registry import ScriptedTurn
from agentruns.runtime.providers.base import ModelRequest, TextDelta, ToolCall, Usage

_TOKEN = re.compile(r"\S+\s*|\s+")


def _default_policy(messages: list[dict]) -> ScriptedTurn:
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    return ScriptedTurn(text=f"Received: {last_user['content'] if last_user else ''}")


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


@functools.cache
def _wants_tools(policy: Callable[..., ScriptedTurn]) -> bool:
    """A policy that takes `tools` is told which tools this turn offers, as a real model is."""
    try:
        return "tools" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False


def _turn(policy: Callable[..., ScriptedTurn], request: ModelRequest) -> ScriptedTurn:
    if _wants_tools(policy):
        offered = [t["function"]["name"] for t in request.tools]
        return policy(request.messages, tools=offered)
    return policy(request.messages)


class ScriptedProvider:
    """One per executor pass (`get_provider`), which sends one growing conversation."""

    def __init__(self) -> None:
        # SCRIPTED_MODEL_LATENCY_MS before each turn's first token (a real model's time to first
        # token), SCRIPTED_MODEL_DELAY_MS between tokens; with neither it answers instantly
        self.latency = conf.SCRIPTED_MODEL_LATENCY_MS / 1000.0
        self.delay = conf.SCRIPTED_MODEL_DELAY_MS / 1000.0
        # the executor gives its database connection back while a model keeps it waiting
        self.waits = bool(self.latency or self.delay)
        # (the conversation's first message, messages counted, their tokens): the executor only
        # appends, so each turn counts its new messages only (a full recount made a long run's
        # steps slower and slower: O(n) per turn)
        self._counted: tuple[object, int, int] | None = None

    def _prompt_tokens(self, messages: list[dict]) -> int:
        first, count, tokens = self._counted or (None, 0, 0)
        if not messages or messages[0] is not first or len(messages) < count:
            count, tokens = 0, 0
        tokens += sum(_estimate_tokens(str(m.get("content") or "")) for m in messages[count:])
        self._counted = (messages[0] if messages else None, len(messages), tokens)
        return tokens

    def stream(self, request: ModelRequest) -> Iterator[TextDelta | ToolCall | Usage]:
        policy = getattr(request.agent, "scripted_policy", None) or _default_policy
        turn = _turn(policy, request)
        delay = self.delay
        if self.latency:
            time.sleep(self.latency)
        for token in _TOKEN.findall(turn.text):
            if delay:
                time.sleep(delay)
            yield TextDelta(token)
        position = len(request.messages)
        for i, (name, args) in enumerate(turn.tool_calls):
            raw = args if isinstance(args, str) else json.dumps(args)  # str: deliberately bad JSON
            yield ToolCall(id=f"call_{position}_{i}", name=name, arguments=raw)
        prompt = self._prompt_tokens(request.messages)
        completion = _estimate_tokens(turn.text) + 10 * len(turn.tool_calls)
        yield Usage(prompt_tokens=prompt, completion_tokens=completion)
