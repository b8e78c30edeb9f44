"""Waiting for an outside event from tool code: `wait_for_event(token, timeout=...)`.

The engineer chooses the token (`f"carrier:{order_id}"`) and hands it to whoever will answer;
`POST /api/hooks/<token>` with a JSON body resumes the run (README, "Waiting for people and
systems"). The run parks while it waits (no thread, no connection, nothing polled per run); when
the event arrives the tool call runs again from its start and `wait_for_event` returns the body
(recorded: a later replay returns the same body). Code before the wait therefore runs again:
make it idempotent (the step's `idempotency_key`), as every durable engine asks.

The registry only declares this: the runtime installs how a wait is kept (`install`), so this
package imports nothing of the runtime.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Protocol

from pydantic import JsonValue
from pydantic_ai.durable_exec import ExternalEventError

MAX_TOKEN_CHARS = 200
# the longest a wait may last (a timeout, a sleep): a year and a day
MAX_WAIT = timedelta(days=366)
# the tokens of a thread's message waits (`messages.py`): no event wait may take one
MESSAGE_TOKEN_PREFIX = "message:"


class EventWaitFailed(ExternalEventError):
    """The event a tool waited for will not arrive (its wait was failed)."""


class EventTimedOut(EventWaitFailed):
    """No event arrived within the wait's timeout."""


class TokenHeld(EventWaitFailed):
    """Another live run waits on this token: `holder` is its run id. One token, one waiter."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class ToolWaits(Protocol):
    """What the runtime provides (runtime/waits/tools.py)."""

    def event(self, token: str, timeout: timedelta | None) -> JsonValue: ...

    def timer(self, due: datetime) -> JsonValue: ...

    def message(self, question: str | None, timeout: timedelta | None) -> JsonValue: ...


_engine: ToolWaits | None = None


def install(engine: ToolWaits) -> None:
    """The runtime's waits (set once at start-up)."""
    global _engine
    _engine = engine


def engine() -> ToolWaits:
    if _engine is None:
        raise RuntimeError("waits need the agentruns runtime (installed when the app is ready)")
    return _engine


def check_token(token: Any) -> str:
    if not isinstance(token, str) or not token.strip():
        raise ValueError("a wait's token is a non-empty string")
    if len(token) > MAX_TOKEN_CHARS or "\x00" in token or "/" in token:
        raise ValueError(
            f"a wait's token has at most {MAX_TOKEN_CHARS} characters and no '/' or NUL"
        )
    if token.startswith(MESSAGE_TOKEN_PREFIX):
        raise ValueError(f"tokens beginning {MESSAGE_TOKEN_PREFIX!r} are a thread's messages'")
    return token


def wait_for_event(token: str, *, timeout: float | timedelta | None = None) -> JsonValue:
    """Wait until `POST /api/hooks/<token>` (or `resolve_wait`) delivers a JSON body; return it.

    Called from a tool (sync or async) while it runs in a run. `timeout` (seconds or a
    timedelta): then `EventTimedOut`. Another live run already waiting on `token`:
    `TokenHeld` at once, naming it. Both are `ExternalEventError`s the tool may catch."""
    check_token(token)
    return engine().event(token, wait_timeout(timeout))


def wait_timeout(timeout: float | timedelta | None) -> timedelta | None:
    """A wait's `timeout` as a timedelta: None or infinity is none; else more than nothing and
    at most `MAX_WAIT` (NaN, a negative number or a century: ValueError, never an overflow)."""
    if timeout is None:
        return None
    if not isinstance(timeout, timedelta):
        try:
            seconds = float(timeout)
        except OverflowError:  # an int past any float
            seconds = math.nan
        if seconds == math.inf:
            return None
        if not 0 < seconds <= MAX_WAIT.total_seconds():  # (NaN too)
            raise ValueError(
                f"a wait's timeout is a positive number of seconds, at most {MAX_WAIT.days} days"
            )
        timeout = timedelta(seconds=seconds)
    if not timedelta(0) < timeout <= MAX_WAIT:
        raise ValueError(f"a wait's timeout is more than nothing, at most {MAX_WAIT.days} days")
    return timeout
