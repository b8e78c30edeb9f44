"""Riding out an outage: capped exponential backoff with jitter, and one line when it starts
and one when it ends (DESIGN.md 4.10).

`faults.py` says which errors are weather; this module says what a loop does about them. Every
long-lived loop of a worker (the sweeper, the lease keeper, the delivery loop, the pool's
heartbeat, q2's pusher through the broker) and every executor that stops a slice on weather
report to the process's `Outage` of that dependency: the first report logs one warning, the
first success after it logs one line with the outage's length, and nothing in between, however
many threads hit the fault. A loop waits `Backoff.next()` between tries, so nobody spins.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from agentruns.backoff import Backoff
from agentruns.runtime.outages.faults import database_unavailable, redis_unavailable

__all__ = ["Backoff", "Outage", "outage_of"]

log = logging.getLogger(__name__)


class Outage:
    """One dependency as this process sees it: up, or down since a moment."""

    def __init__(self, dependency: str) -> None:
        self.dependency = dependency
        self._lock = threading.Lock()
        self.down_since: float | None = None  # time.monotonic() of the first failure
        self.errors = 0  # faults reported since the process started (/metrics)
        self.changed_at: float | None = None  # time.time() of the last change, up or down

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def noticed(self, exc: BaseException, where: str) -> None:
        """A fault of the dependency: the first one since it was last up logs one warning."""
        with self._lock:
            self.errors += 1
            if self.down_since is not None:
                return
            self.down_since, self.changed_at = time.monotonic(), time.time()
        log.warning(
            "%s unavailable (noticed by %s): %s; retrying with backoff, runs continue when it is "
            "back",
            self.dependency,
            where,
            _one_line(exc),
        )

    def passed(self) -> float | None:
        """The dependency answered: if it was down, log once how long; returns that length."""
        if self.down_since is None:  # the common case: no lock
            return None
        with self._lock:
            if self.down_since is None:
                return None
            length, self.down_since = time.monotonic() - self.down_since, None
            self.changed_at = time.time()
        log.warning("%s is back after %.1fs", self.dependency, length)
        return length

    def state(self) -> dict[str, Any]:
        """What this process saw of the dependency, for its heartbeat and /metrics."""
        return {"up": not self.is_down, "errors": self.errors, "changed_at": self.changed_at}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


database = Outage("database")
redis = Outage("redis")


def outage_of(exc: BaseException) -> Outage:
    """The dependency an infrastructure error (`faults.is_infrastructure_error`) is about."""
    return redis if redis_unavailable(exc) and not database_unavailable(exc) else database
