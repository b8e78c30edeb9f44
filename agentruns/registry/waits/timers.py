"""Durable sleeps: `sleep_until` / `sleep_for` for tool code, and the model's tools `wait_until`
and `wait_for` (offered by `wait_tools()`).

The run parks until the time is due, holding no thread, no connection and no per-run polling:
the wait's `due_at` is indexed, and each worker cluster's sweeper, which looks at the database
anyway, wakes the runs that are due at their time (runtime/waits/due.py). A sleep shorter than
its look (a second) is slept on the run's thread, its wait recorded all the same.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import JsonValue

from agentruns.registry.waits.events import MAX_WAIT, engine

# a sleep of the model's may be long (days); beyond a year it is a mistake, refused
MAX_SLEEP = MAX_WAIT


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def sleep_until(when: datetime) -> JsonValue:
    """Park the run until `when` (a naive time is UTC); returns `{"woke_at": ISO 8601}`."""
    when = _aware(when)
    if when - datetime.now(UTC) > MAX_SLEEP:
        raise ValueError(f"a sleep may last at most {MAX_SLEEP.days} days")
    return engine().timer(when)


def sleep_for(seconds: float) -> JsonValue:
    seconds = float(seconds)
    if not seconds >= 0:  # (NaN too)
        raise ValueError("seconds must be a number >= 0")
    return sleep_until(datetime.now(UTC) + timedelta(seconds=min(seconds, 10**9)))


def wait_until(when: str) -> str:
    """Wait until a moment in time, then continue.

    Args:
        when: an ISO 8601 date and time, e.g. 2026-12-24T09:00:00Z (without a zone: UTC).
    """
    try:
        moment = datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return f"error: {when!r} is not an ISO 8601 date and time (e.g. 2026-12-24T09:00:00Z)"
    try:
        woke = sleep_until(moment)
    except ValueError as exc:
        return f"error: {exc}"
    return f"Waited until {_aware(moment).isoformat()}; it is now {_woke_at(woke)}."


def wait_for(seconds: float) -> str:
    """Wait this many seconds (hours and days too: 86400 is a day), then continue.

    Args:
        seconds: how long to wait, in seconds.
    """
    try:
        woke = sleep_for(seconds)
    except ValueError as exc:
        return f"error: {exc}"
    return f"Waited {seconds:g} s; it is now {_woke_at(woke)}."


def _woke_at(woke: JsonValue) -> str:
    return str(woke.get("woke_at")) if isinstance(woke, dict) else str(woke)
