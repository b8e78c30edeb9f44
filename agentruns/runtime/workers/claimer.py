"""A worker process's claimer: queued runs straight from PostgreSQL into the pool's free slots.

One thread per q2 worker process (started when q2 spawns it, `start_claimer`), PostgreSQL only.
It LISTENs on `claims.CHANNEL` on a connection of its own (outside the pool: one more connection
per worker process) and, whenever a start's NOTIFY arrives, or every
AGENTRUNS_RUN_CLAIM_POLL_SECONDS without one, reserves the pool's free slots (at most
AGENTRUNS_RUN_CLAIM_BATCH) and claims that many of the oldest queued runs in one statement
(`dispatch/claims.py`). A full batch means more may wait: it claims again as soon as a slot is
free, without waiting for a NOTIFY. A full process claims nothing, so it never hoards: a sibling
with room takes the rest. Once a poll interval it also re-lets running runs whose lease expired
(`claims.relet_abandoned`): a killed process's runs continue on a sibling's free slots without a
trip through q2, whose doorbell from the sweeper stays the backstop.

The q2 doorbell path is unchanged beside it (the sweeper's doorbells, approvals, yields); both
end in the same pool and the lease decides. A database outage is weather: the claimer backs off
(capped at a second) and listens again when the database is back.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import connection

from agentruns.conf import conf
from agentruns.runtime.dispatch import claims, connections
from agentruns.runtime.execution import transitions
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread
from agentruns.runtime.workers.pool import RunPool, process_pool

log = logging.getLogger(__name__)


class RunClaimer(OwnedThread):
    name = "run-claimer"

    def __init__(self, pool: RunPool, *, batch: int | None = None, poll: float | None = None):
        super().__init__()
        self.pool = pool
        self.batch = conf.RUN_CLAIM_BATCH if batch is None else batch
        self.poll = conf.RUN_CLAIM_POLL_SECONDS if poll is None else poll
        self.listener: Any = None
        self.claimed = 0  # runs this claimer took (tests, logs)
        self.relet = 0  # of those, running runs whose lease had expired
        self._relet_due = 0.0  # monotonic: at most one look for abandoned runs per poll interval

    def run(self) -> None:
        backoff = weather.Backoff(base=0.1, cap=1.0)
        more = True  # at start: whatever was queued while no worker listened
        while not (self.pool.closing.is_set() or self.stopped.is_set()):
            try:
                if self.listener is None:
                    self.listener = self._listen()
                    more = True  # NOTIFYs sent while nobody listened are gone: look
                if not more:
                    self._wait_for_notify(self.poll)
                if not self.pool.wait_for_free_slot(self.poll):
                    more = True  # full: NOTIFYs meanwhile are for whoever has room; look later
                    continue
                more = self.claim_once()
                weather.database.passed()
                backoff.reset()
            except Exception as exc:
                self._drop_listener()
                if not is_infrastructure_error(exc):
                    log.warning("run claimer failed; trying again", exc_info=True)
                else:
                    weather.database.noticed(exc, "the run claimer")
                self.pool.closing.wait(backoff.next())
            finally:
                connection.close()  # the claim's pooled connection goes back between claims
        self._drop_listener()

    def claim_once(self) -> bool:
        """Claim into the free slots; True when the batch was full (more may be waiting)."""
        slots = self.pool.reserve(self.batch)
        taken: list = []
        try:
            taken = claims.claim_queued(slots, transitions.started().events)
            if len(taken) < slots and time.monotonic() >= self._relet_due:
                self._relet_due = time.monotonic() + self.poll
                abandoned = claims.relet_abandoned(slots - len(taken))
                self.relet += len(abandoned)
                taken = taken + abandoned
        finally:  # what was taken runs even if a second statement failed: its lease is ours
            self.pool.unreserve(slots - len(taken))
            for run in taken:
                self.pool.start_claimed(run)
            self.claimed += len(taken)
        return slots > 0 and len(taken) == slots

    def _wait_for_notify(self, timeout: float) -> None:
        """Until a NOTIFY or `timeout`; then take every NOTIFY already here (one claim serves
        them all)."""
        for _ in self.listener.notifies(timeout=timeout, stop_after=1):
            pass
        for _ in self.listener.notifies(timeout=0):
            pass

    @staticmethod
    def _listen() -> Any:
        return connections.open_listener(claims.CHANNEL)

    def _drop_listener(self) -> None:
        listener, self.listener = self.listener, None
        connections.close_listener(listener)


def start_claimer(**_: Any) -> RunClaimer | None:
    """When q2 spawns a worker process (its `post_spawn` signal): this process's pool and its
    claimer, on PostgreSQL with claims on; None otherwise (starts ring q2 doorbells)."""
    if conf.RUN_CLAIM_BATCH <= 0 or connection.vendor != "postgresql":
        return None
    claimer = RunClaimer(process_pool())
    claimer.start()
    return claimer
