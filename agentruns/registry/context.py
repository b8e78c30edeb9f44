"""`current_step()`: the step a running tool belongs to, for code that is not handed a ToolContext
(a Pydantic AI tool receives its `RunContext`, an MCP call nothing of ours)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_current: ContextVar[Any] = ContextVar("agentruns_current_step", default=None)


def current_step() -> Any:
    """The `ToolContext` (`run`, `step`, `attempt`, `idempotency_key`) of the tool call running
    in this thread; LookupError outside a tool call."""
    ctx = _current.get()
    if ctx is None:
        raise LookupError("current_step() is only available while a tool call runs")
    return ctx


@contextmanager
def stepping(ctx: Any) -> Iterator[None]:
    """Make `ctx` the current step for the duration of one tool call (the engine's call_tool)."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)
