"""The lease heartbeat: one keeper thread per process renews the leases of all its executors.

Every engine commit renews its run's lease (`RunExecutor.commit`), so only a run that has not
committed for TTL/3 (a long model turn, a slow tool) needs the keeper. Each cycle the keeper
renews every such lease of the process in ONE statement and flags each executor whose lease
was taken meanwhile (`Heartbeat.lost`): the executor stops at its next check, and its fenced
commits would fail anyway.

While the database is away the keeper cannot renew: it backs off (`weather.py`) and flags no
lease as lost, since nobody knows yet; the fence decides when it is back (an executor whose lease
lapsed meanwhile has its next commit refused, so a step never runs twice at once). Executors that
stopped their slice on weather leave their runs here (`hand_back`): once the database answers,
the keeper releases those leases and rings their doorbells in one transaction, so they continue
within a second or two of its return instead of after the lease TTL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from agentruns.models import Run, RunStatus
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.store.sql import run_value
from agentruns.runtime.threads import OwnedThread

log = logging.getLogger(__name__)


class Heartbeat:
    """A run's registration with the process's keeper: a dict entry, not a thread (starting and
    joining a thread per run cost ~0.2 ms, measured). `lost` is set when the lease turns out to
    belong to someone else."""

    def __init__(self, run_id: uuid.UUID, owner: str, ttl: float) -> None:
        self.run_id, self.owner, self.ttl = run_id, owner, ttl
        self.lost = threading.Event()
        self.due = 0.0

    def start(self) -> None:
        self.due = time.monotonic() + self.ttl / 3
        _keeper().add(self)

    def stop(self) -> None:
        _keeper().remove(self)

    def renewed(self) -> None:
        """The executor's own commit just renewed the lease: the keeper may wait another TTL/3."""
        self.due = time.monotonic() + self.ttl / 3


TABLE = Run._meta.db_table


def _held_by(leases: list[tuple[uuid.UUID, str]]) -> tuple[str, list]:
    """The WHERE clause (and its parameters) matching the runs of `leases` (run id, owner) while
    their owner holds them: ids IN (...) AND owners IN (...). Every owner (an executor) holds one
    run, so the cross product matches only the given pairs."""
    ids = [run_value("id", run_id) for run_id, _ in leases]
    owners = sorted({owner for _, owner in leases})
    where = (
        f"id IN ({', '.join(['%s'] * len(ids))}) "
        f"AND lease_owner IN ({', '.join(['%s'] * len(owners))})"
    )
    return where, [*ids, *owners]


def renew(beats: list[Heartbeat]) -> list[Heartbeat]:
    """Extend the leases of `beats` in one statement (one per distinct TTL; production has one);
    returns the beats whose lease was no longer theirs."""
    by_ttl: dict[float, list[Heartbeat]] = defaultdict(list)
    for beat in beats:
        by_ttl[beat.ttl].append(beat)
    held: set[tuple[str, str]] = set()
    for ttl, group in by_ttl.items():
        where, params = _held_by([(b.run_id, b.owner) for b in group])
        # (id, owner) pairs come back for the leases still held; a run that changed hands to
        # another executor of this process is renewed for that one and flagged for this one
        sql = f"UPDATE {TABLE} SET lease_expires_at = %s WHERE {where} RETURNING id, lease_owner"
        expires = run_value("lease_expires_at", timezone.now() + timedelta(seconds=ttl))
        with connection.cursor() as cursor:
            cursor.execute(sql, [expires, *params])
            held.update((str(uuid.UUID(str(i))), owner) for i, owner in cursor.fetchall())
    return [b for b in beats if (str(b.run_id), b.owner) not in held]


def release_leases(leases: list[tuple[uuid.UUID, str]]) -> int:
    """Give up the leases (run id, owner) of runs this process can no longer finish (a drain
    whose grace ran out) and ring their doorbells, in one transaction: the next worker recovers
    their running steps by idempotency class now, not after the lease TTL. Our own executors'
    later commits fail on the fence. Returns how many were released."""
    if not leases:
        return 0
    where, params = _held_by(leases)
    sql = (
        f"UPDATE {TABLE} SET lease_owner = '', lease_expires_at = NULL, enqueued_at = %s "
        f"WHERE {where} AND status IN (%s, %s) RETURNING id"
    )
    now = run_value("enqueued_at", timezone.now())
    released = 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, [now, *params, RunStatus.QUEUED, RunStatus.RUNNING])
            rows = cursor.fetchall()
        for (run_id,) in rows:
            enqueue(uuid.UUID(str(run_id)))
            released += 1
    return released


def hand_back_runs(runs: list[tuple[uuid.UUID, str]]) -> int:
    """Runs (id, owner) whose slice stopped on weather: release each lease still that owner's
    and ring every run still live whose lease is now free (a claim that failed left none), in one
    transaction. A lease another executor holds is left alone. Returns how many were rung."""
    if not runs:
        return 0
    now = timezone.now()
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    live = Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
    live = live.filter(waiting_behind__isnull=True)  # not one waiting in its key's line
    rung = 0
    with transaction.atomic():
        for run_id, owner in runs:
            mine = live.filter(id=run_id, lease_owner=owner)
            released = mine.update(lease_owner="", lease_expires_at=None, enqueued_at=now)
            if released or live.filter(free, id=run_id).update(enqueued_at=now):
                enqueue(run_id)
                rung += 1
    return rung


IDLE_POLL_SECONDS = 1.0


class _LeaseKeeper(OwnedThread):
    name = "lease-keeper"

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.beats: set[Heartbeat] = set()
        self.sleeps_until = float("inf")
        self.handed_back: set[tuple[uuid.UUID, str]] = set()
        self.backoff = weather.Backoff()
        self.retry_at = 0.0  # while the database is away: the next try, not before

    def hand_back(self, run_id: uuid.UUID, owner: str) -> None:
        """A run whose slice stopped on weather: release and ring it once the database answers."""
        with self.lock:
            self.handed_back.add((run_id, owner))
        self.wake.set()

    def add(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.add(beat)
            if beat.due < self.sleeps_until:  # otherwise it is renewed in time anyway
                self.wake.set()

    def remove(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.discard(beat)

    def stop(self) -> None:
        super().stop()
        self.wake.set()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.wake.clear()
            if time.monotonic() >= self.retry_at:
                self._cycle()
            with self.lock:
                # at most IDLE_POLL_SECONDS, so that registering a run rarely has to wake us
                self.sleeps_until = min(
                    [b.due for b in self.beats if not b.lost.is_set()]
                    + [time.monotonic() + IDLE_POLL_SECONDS]
                )
                if self.handed_back:
                    self.sleeps_until = min(self.sleeps_until, self.retry_at)
                self.sleeps_until = max(self.sleeps_until, self.retry_at)
            self.wake.wait(max(0.0, self.sleeps_until - time.monotonic()))

    def _cycle(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = [b for b in self.beats if b.due <= now and not b.lost.is_set()]
            handed_back = list(self.handed_back)
        if not due and not handed_back:
            return
        try:
            if handed_back:
                hand_back_runs(handed_back)
                with self.lock:
                    self.handed_back.difference_update(handed_back)
            if due:
                for beat in renew(due):
                    beat.lost.set()
                for beat in due:
                    beat.due = time.monotonic() + beat.ttl / 3
            weather.database.passed()
            self.backoff.reset()
            self.retry_at = 0.0
        except Exception as exc:
            if not is_infrastructure_error(exc):
                log.warning("lease renewal failed for %d run(s)", len(due), exc_info=True)
                for beat in due:
                    beat.due = time.monotonic() + beat.ttl / 3
                with self.lock:  # not weather: their leases lapse and the sweeper rings them
                    self.handed_back.difference_update(handed_back)
            else:
                # nobody knows whose the leases are now: flag none, the fence decides later
                weather.database.noticed(exc, "the lease keeper")
                self.retry_at = time.monotonic() + self.backoff.next()
        finally:
            # renewals are rare (only steps longer than TTL/3): no connection held between
            # cycles (with a pool: back to it)
            connection.close()


def hand_back(run_id: uuid.UUID, owner: str) -> None:
    """Leave a run whose slice stopped on weather to the process's keeper (see the module)."""
    _keeper().hand_back(run_id, owner)


_keeper_of: tuple[int, _LeaseKeeper] | None = None
_keeper_lock = threading.Lock()


def _keeper() -> _LeaseKeeper:
    """The process's keeper thread (keyed by pid: a forked worker starts its own)."""
    global _keeper_of
    with _keeper_lock:
        if _keeper_of is None or _keeper_of[0] != os.getpid() or _keeper_of[1].stopped.is_set():
            keeper = _LeaseKeeper()
            keeper.start()
            _keeper_of = (os.getpid(), keeper)
        return _keeper_of[1]
