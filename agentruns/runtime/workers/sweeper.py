"""Recovery: re-ring runs whose worker died or whose doorbell was lost (DESIGN.md 4.3).

`sweep()` is safe anywhere, any number of times at once: each run is re-rung by a
compare-and-set on `enqueued_at`. It runs as a fast loop in every `qcluster` (`SweeperLoop`),
once at its start, and as a q2 schedule (the backstop; schedules fire at 30 s granularity).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, RunStatus, WorkerHeartbeat
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread
from agentruns.runtime.values.ids import worker_name
from agentruns.runtime.waits.due import fire_due_waits

log = logging.getLogger(__name__)

SWEEP_SCHEDULE_NAME = "agentruns.sweep"
# stored in the schedule row: renaming it strands the schedule
SWEEP_TASK = "agentruns.tasks.scheduled_sweep"


def sweep(now: datetime | None = None) -> int:
    """Re-enqueue live runs whose lease expired (their worker died) or whose task was lost,
    expire approvals past their expiry and escalate those past their due time. Returns how many
    runs were rung."""
    now = now or timezone.now()
    ttl = timedelta(seconds=conf.LEASE_TTL_SECONDS)
    resweep = max(ttl, timedelta(seconds=5))
    # A lease renewed after the last doorbell (expiry - TTL > enqueued_at) means a worker took
    # that task and died: ring again at once, so a killed worker's run continues within
    # lease TTL + sweep interval. Otherwise the task may still sit in the queue: wait `resweep`.
    claimed_since_doorbell = Q(lease_expires_at__gt=F("enqueued_at") + ttl)
    stale = (
        Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
        # waiting in its concurrency key's line: admitted (and rung) by the run ahead's end
        .filter(waiting_behind__isnull=True)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .filter(
            Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - resweep) | claimed_since_doorbell
        )
        .values_list("id", "enqueued_at")[:500]
    )
    rung = 0
    for run_id, enqueued_at in list(stale):
        with transaction.atomic():
            # compare-and-set so two sweepers ring the doorbell once
            ringable = Run.objects.filter(id=run_id, enqueued_at=enqueued_at, waiting_behind=None)
            if ringable.update(enqueued_at=now):
                enqueue(run_id)
                rung += 1
    fire_due_waits(now)  # each cluster's DueWaitsLoop fires them at their time: the backstop
    expired = inbox().expire_due(now)
    escalated = inbox().escalate_due(now)
    if rung or expired or escalated:
        log.info(
            "sweeper: re-enqueued %d run(s), expired %d and escalated %d approval(s)",
            rung,
            expired,
            escalated,
        )
    return rung


# a row per worker process (every restart and q2 recycle is a new pid): forget long-gone ones
HEARTBEAT_RETENTION = timedelta(hours=1)
HEARTBEAT_PRUNE_EVERY = timedelta(minutes=1)
_pruned_at: datetime | None = None  # this process's last prune


def record_heartbeat(name: str, swept: bool) -> None:
    now = timezone.now()
    defaults = {"last_seen_at": now}
    if swept:
        defaults["last_sweep_at"] = now
    WorkerHeartbeat.objects.update_or_create(worker=name, defaults=defaults)
    global _pruned_at
    if _pruned_at is None or now - _pruned_at >= HEARTBEAT_PRUNE_EVERY:
        # rows of processes gone for an hour; a minute apart is often enough (the loop beats
        # every few seconds in every cluster)
        WorkerHeartbeat.objects.filter(last_seen_at__lt=now - HEARTBEAT_RETENTION).delete()
        _pruned_at = now


# the q2 schedules this app keeps: name -> the row's fields
def _schedules() -> dict[str, dict]:
    from django_q.models import Schedule  # q2's models: only once apps are ready

    return {
        SWEEP_SCHEDULE_NAME: {
            "func": SWEEP_TASK,
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
        }
    }


# the advisory lock every worker's start-up takes while it writes the schedule rows
SCHEDULES_LOCK = "agentruns.schedules"


def ensure_schedule() -> None:
    """Exactly one row of each schedule this app keeps, however many workers start at once.

    `django_q_schedule.name` is not unique, so a look-then-create by two workers starting at the
    same moment made two rows, and every later `update_or_create` raised MultipleObjectsReturned
    (each restart exited at start-up). Writers take turns here: PostgreSQL: an advisory lock of
    the transaction; SQLite: the write lock its IMMEDIATE transactions take at BEGIN
    (config/settings.py). Duplicates already there (an older version's race) are deleted, the
    oldest row kept: its next run stands."""
    from django_q.models import Schedule

    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [SCHEDULES_LOCK]
                )
        for name, fields in _schedules().items():
            rows = list(Schedule.objects.filter(name=name).order_by("id"))
            if len(rows) > 1:
                Schedule.objects.filter(id__in=[r.id for r in rows[1:]]).delete()
                log.warning("schedule %s: removed %d duplicate row(s)", name, len(rows) - 1)
            if not rows:
                Schedule.objects.create(name=name, **fields)
            elif any(getattr(rows[0], field) != value for field, value in fields.items()):
                Schedule.objects.filter(id=rows[0].id).update(**fields)


class SweeperLoop(OwnedThread):
    """The fast sweeper: every AGENTRUNS_SWEEP_INTERVAL_SECONDS, in the qcluster process.

    While the database is away it tries again with a backoff capped at that interval, so its
    first pass after the outage comes within an interval of the database's return."""

    name = "agentruns-sweeper"

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.worker = name or f"qcluster@{worker_name()}"

    def run(self) -> None:
        interval = conf.SWEEP_INTERVAL_SECONDS
        # while the database is away: tries at most `interval` apart, from a quarter of it up
        backoff = weather.Backoff(base=min(0.25, interval / 4), cap=interval)
        while not self.stopped.is_set():
            wait = interval
            try:
                close_old_connections()
                sweep()
                record_heartbeat(self.worker, swept=True)
                weather.database.passed()
                backoff.reset()
            except Exception as exc:
                if is_infrastructure_error(exc):
                    weather.database.noticed(exc, "the sweeper")
                    wait = backoff.next()
                else:
                    log.warning("sweeper pass failed", exc_info=True)
                connection.close()
            self.stopped.wait(wait)
        connection.close()
