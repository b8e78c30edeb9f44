"""The one backoff of the project: capped exponential delays with jitter.

Everything that waits before trying again uses it: a tool's retry policy
(`registry.RetryPolicy`), a model or tool server's outage (`runtime/outages`), every worker
loop riding out a database or Redis outage (`outages/weather.py`), psycopg's reconnections
(`dispatch/connections.py`) and the webhook deliveries (approvals). Jitter spreads the tries
of many runs and processes that failed at the same moment, so they do not come back together.
"""

from __future__ import annotations

import random


def jittered(value: float, jitter: float, *, at: float | None = None) -> float:
    """`value` +- `jitter` (a fraction of it): at random, or at `at` (-1 .. 1) of the range."""
    spread = random.uniform(-1.0, 1.0) if at is None else at
    return value * (1 + jitter * spread)


def delay(
    failures: int,
    *,
    base: float,
    cap: float,
    jitter: float = 0.25,
    factor: float = 2.0,
    at: float | None = None,
) -> float:
    """Seconds to wait after the `failures`-th failure in a row (1 for the first):
    base x factor^(failures - 1), at most `cap`, then +- `jitter`; never negative."""
    raw = min(cap, base * factor ** max(0, failures - 1))
    return max(0.0, jittered(raw, jitter, at=at))


class Backoff:
    """`delay` for a loop that counts its own failures: `next()` after each, `reset()` once it
    succeeds (base, 2 x base, 4 x base ... capped at `cap`)."""

    def __init__(self, base: float = 0.25, cap: float = 2.0, jitter: float = 0.25) -> None:
        self.base, self.cap, self.jitter = base, cap, jitter
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return delay(self.failures, base=self.base, cap=self.cap, jitter=self.jitter)

    def reset(self) -> None:
        self.failures = 0
