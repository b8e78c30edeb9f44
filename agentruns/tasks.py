"""django-q2 entry points. q2 is only the doorbell: the run's lease decides who executes."""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from agentruns.models import Run, RunStatus, WorkerHeartbeat
from agentruns.runtime.executor import RunExecutor

log = logging.getLogger(__name__)

SWEEP_SCHEDULE_NAME = "agentruns.sweep"


def advance_run(run_id: str) -> str:
    """The only executor of runs. Duplicated deliveries find the lease held and return."""
    return RunExecutor(run_id).advance()


def sweep(now=None) -> int:
    """Re-enqueue live runs whose lease expired (their worker died) or whose task was lost,
    and expire overdue approvals. Safe to run anywhere, any number of times at once."""
    from agentruns.services import enqueue
    from approvals.services import expire_due_approvals

    now = now or timezone.now()
    ttl = timedelta(seconds=float(settings.AGENTRUNS_LEASE_TTL_SECONDS))
    resweep = max(ttl, timedelta(seconds=5))
    # A lease renewed after the last doorbell (expiry - TTL > enqueued_at) means a worker took
    # that task and died: ring again at once, so a killed worker's run continues within
    # lease TTL + sweep interval. Otherwise the task may still sit in the queue: wait `resweep`.
    claimed_since_doorbell = Q(lease_expires_at__gt=F("enqueued_at") + ttl)
    stale = (
        Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
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
            if Run.objects.filter(id=run_id, enqueued_at=enqueued_at).update(enqueued_at=now):
                enqueue(run_id)
                rung += 1
    expired = expire_due_approvals(now)
    if rung or expired:
        log.info("sweeper: re-enqueued %d run(s), expired %d approval(s)", rung, expired)
    return rung


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def record_heartbeat(name: str, swept: bool) -> None:
    now = timezone.now()
    defaults = {"last_seen_at": now}
    if swept:
        defaults["last_sweep_at"] = now
    WorkerHeartbeat.objects.update_or_create(worker=name, defaults=defaults)


def scheduled_sweep() -> int:
    """The django-q2 schedule: the backstop when no fast loop runs (30 s granularity)."""
    rung = sweep()
    record_heartbeat(f"schedule@{worker_name()}", swept=True)
    return rung


def ensure_schedule() -> None:
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name=SWEEP_SCHEDULE_NAME,
        defaults={
            "func": "agentruns.tasks.scheduled_sweep",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
        },
    )


class SweeperLoop(threading.Thread):
    """The fast sweeper: every AGENTRUNS_SWEEP_INTERVAL_SECONDS, in the qcluster process."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name="agentruns-sweeper", daemon=True)
        self.worker = name or f"qcluster@{worker_name()}"
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = float(settings.AGENTRUNS_SWEEP_INTERVAL_SECONDS)
        while not self.stopped.is_set():
            try:
                close_old_connections()
                sweep()
                record_heartbeat(self.worker, swept=True)
            except Exception:
                log.warning("sweeper pass failed", exc_info=True)
                connection.close()
            self.stopped.wait(interval)
        connection.close()
