"""Waits past their `due_at`: a timer wakes its run, an event wait's timeout fails it.

Nothing polls a run: one indexed query (`wait_pending_due_idx`: pending waits by `due_at`) finds
what is due, made beside the sweeper in each qcluster's main process (`DueWaitsLoop`: that
process executes no run, so busy workers never hold a timer up, and its own thread, so a slow
sweep does not either): it looks once a second a little ahead (`DueWaits`), keeps what comes
due soon and fires each at its due time: a timer wakes within milliseconds of due however many
runs sleep, at one query a second per cluster. The sweep (`sweep`, and the q2 schedule) fires
whatever is past due as the backstop.
Any number of processes may fire at once: each wait is a compare-and-set (`SKIP LOCKED`, then
pending -> resolved; one another process holds is looked at again 0.1 s later, so a process
that dies mid-fire does not hold it up until the next look), and everything due at once is one
transaction, its runs queued in it
(`transitions.resume_waiting`: a few statements plus one per run; one at a time cost eleven
each, and 200 timers due within five seconds woke 8 s late on a loaded machine).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from agentruns.models import Wait, WaitKind, WaitStatus
from agentruns.runtime import writer
from agentruns.runtime.execution.transitions import resume_waiting
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread
from agentruns.runtime.waits.tools import LOOK_SECONDS, TIMED_OUT, woke

log = logging.getLogger(__name__)

BATCH = 500
RETRY_SECONDS = 0.1  # a wait another process was firing, looked at again (`DueWaits`)


def due_within(horizon: timedelta, now: datetime | None = None) -> list[tuple[datetime, int]]:
    """(due_at, id) of the pending waits due before `now + horizon`, the soonest first."""
    until = (now or timezone.now()) + horizon
    rows = Wait.objects.filter(status=WaitStatus.PENDING, due_at__lte=until)
    return list(rows.order_by("due_at").values_list("due_at", "id")[:BATCH])


def fire(wait_ids: list[int], now: datetime | None = None) -> int:
    """These waits come due: timers are resolved, any other wait fails with its timeout, and
    their runs are queued, all in one transaction of a few statements plus one per run. Returns
    how many this call fired (a wait somebody else fired or resolved first is skipped)."""
    return len(fire_waits(wait_ids, now))


def fire_waits(wait_ids: list[int], now: datetime | None = None) -> list[int]:
    """`fire`, answering the ids of the waits this call fired."""
    now = now or timezone.now()
    with transaction.atomic():
        waits = list(
            Wait.objects.select_for_update(skip_locked=True).filter(
                id__in=wait_ids, status=WaitStatus.PENDING
            )
        )
        if not waits:
            return []
        for wait in waits:
            if wait.kind == WaitKind.TIMER:
                wait.status, wait.payload, wait.resolved_by = (
                    WaitStatus.RESOLVED,
                    woke(wait.due_at, now),
                    "timer",
                )
            else:
                waited = (wait.due_at or now) - wait.created_at
                wait.status, wait.resolved_by = WaitStatus.FAILED, TIMED_OUT
                wait.error = f"No resolution arrived within {waited}."
            wait.resolved_at = now
        writer.save_waits(waits, ["status", "payload", "error", "resolved_by", "resolved_at"])
        resume_waiting([wait.run_id for wait in waits], now)
    return [wait.id for wait in waits]


def fire_due_waits(now: datetime | None = None) -> int:
    """Everything past due now (the sweeper). Returns how many waits this call fired."""
    now = now or timezone.now()
    return fire([wait_id for _, wait_id in due_within(timedelta(0), now)], now)


class DueWaits:
    """A cluster's view of the waits coming due: it looks every `every` seconds, `every * 2`
    ahead (so a wait is seen before its time even when a look is late), and fires each at its
    due time (`tick`); `sleep_for` says how long its thread may sleep before the next."""

    def __init__(self, every: float = LOOK_SECONDS) -> None:
        self.every = every
        self.next_look = 0.0  # time.monotonic() of the next query
        self.soon: list[tuple[datetime, int]] = []
        self.fired = 0

    def tick(self) -> int:
        if time.monotonic() >= self.next_look:
            self.soon = due_within(timedelta(seconds=self.every * 2))
            self.next_look = time.monotonic() + self.every
        now = timezone.now()
        due = [wait_id for due_at, wait_id in self.soon if due_at <= now]
        if not due:
            return 0
        self.soon = [(due_at, wait_id) for due_at, wait_id in self.soon if due_at > now]
        fired = fire_waits(due, now)
        self.fired += len(fired)
        self._try_again(set(due) - set(fired), now)
        return len(fired)

    def _try_again(self, skipped: set[int], now: datetime) -> None:
        """Waits this look found locked: another process is firing them. Those still pending
        are tried again in RETRY_SECONDS, so a process that dies in the middle of its fire holds
        them up that long, not until the next look."""
        if not skipped:
            return
        pending = Wait.objects.filter(id__in=skipped, status=WaitStatus.PENDING)
        again = now + timedelta(seconds=RETRY_SECONDS)
        self.soon = sorted(self.soon + [(again, i) for i in pending.values_list("id", flat=True)])

    def sleep_for(self, cap: float) -> float:
        """Seconds until the next look or the next known due wait, at most `cap`."""
        until = min(cap, self.next_look - time.monotonic())
        if self.soon:
            until = min(until, (self.soon[0][0] - timezone.now()).total_seconds())
        return max(0.0, until)


class DueWaitsLoop(OwnedThread):
    """`DueWaits` on a thread of its own in the qcluster's main process (beside the sweeper)."""

    name = "agentruns-due-waits"

    def run(self) -> None:
        due = DueWaits()
        backoff = weather.Backoff(base=0.25, cap=LOOK_SECONDS)  # while the database is away
        while not self.stopped.is_set():
            try:
                close_old_connections()
                due.tick()
                wait = due.sleep_for(LOOK_SECONDS)
                backoff.reset()
            except Exception as exc:
                if is_infrastructure_error(exc):
                    weather.database.noticed(exc, "the due waits")
                else:
                    log.warning("due waits: a look failed", exc_info=True)
                wait = backoff.next()
                connection.close()
            self.stopped.wait(wait)
        connection.close()
