from __future__ import annotations

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

# the moment (time.time()) a model request under a rate limit may leave, its slot
# (runtime/access/model_limits.py): a provider whose HTTP client waits for it at the wire says so
# with `precise_start = True`; the others are sent once the caller's thread has waited for it
NOT_BEFORE: ContextVar[float | None] = ContextVar("agentruns_not_before", default=None)


@dataclass
class ModelRequest:
    model: str
    messages: list[dict]
    tools: list[dict]
    agent: Any = None  # the registry Agent (the scripted provider reads its policy)


@dataclass
class TextDelta:
    text: str


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it; validated by the engine


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


class TextSink:
    """Where a provider that streams can hand text deltas without returning to its caller.

    While `take` is None every delta is yielded as a `TextDelta`; once the caller sets it (the
    executor: after a turn's first delta, to its delta feed), the provider calls `take(text)`
    for each later delta instead, from inside the stream's coroutine: `take` must not touch the
    database (Django refuses inside a running loop) and must be thread-safe. What `take` raises
    ends the stream and is raised from `stream()` as it is."""

    __slots__ = ("take",)

    def __init__(self) -> None:
        self.take: Callable[[str], None] | None = None


class ModelError(Exception):
    """A model call failed. `retryable=False` fails the run with this message; a retryable one
    is an outage the run backs off from (runtime/outages/model_outage.py), not before `retry_after`
    seconds when the server said so."""

    def __init__(
        self, message: str, *, retryable: bool = True, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class ModelProvider(Protocol):
    # optional attribute `waits: bool` (default True): the model keeps the executor waiting, so
    # it gives its database connection back for the stream (False only for instant answers);
    # `precise_start: bool` (default False): its requests wait for NOT_BEFORE at the wire; and
    # `prepare()`: build what a request needs before it waits for a rate-limit slot

    def stream(
        self, request: ModelRequest, sink: TextSink | None = None
    ) -> Iterator[TextDelta | ToolCall | Usage]:
        """Yield text deltas as they arrive (those `sink.take` does not take), then complete tool
        calls, then usage."""
        ...
