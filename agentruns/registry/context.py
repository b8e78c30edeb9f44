"""What a running tool receives besides its arguments (`ToolContext`), and `current_step()`: the
step a running tool belongs to, for code that is not handed a ToolContext (a Pydantic AI tool
receives its `RunContext`, an MCP call nothing of ours)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolContext:
    """What a tool receives besides its arguments."""

    run: Any
    step: Any
    attempt: int
    idempotency_key: str
    # the W3C trace context for the call's outgoing requests (send it as the `traceparent`
    # header): the tool's span when tracing is on, else the run's root span
    traceparent: str = ""
    # waits this execution of the call made so far (`wait_for_event`, timers): the n-th is found
    # again by its order when the call runs again after the run resumed
    waits_seen: int = 0
    # the decision that let this call run, when people approved it (None: no approval): `by`,
    # `at`, `reason` (the approver's words, which the agent may pass on to the customer),
    # `requested` and `approved` (the arguments asked for, and the ones approved and running)
    approval: dict[str, Any] | None = None


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
