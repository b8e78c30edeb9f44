"""Claiming queued runs straight from PostgreSQL, a batch per statement (issue 22).

On PostgreSQL a start does not ring a q2 doorbell: the statement that creates the run also
sends `NOTIFY agentruns_runs` (delivered on commit). Every worker process listens
(`workers/claimer.py`) and, with free slots, takes the oldest queued runs whose lease is free in
ONE statement: `FOR UPDATE SKIP LOCKED` keeps concurrent claimers off each other's rows, and the
same statement does what `RunExecutor.claim` does per run (queued -> running, a lease per run,
its status event, the seq). A start then costs one statement and no q2 task, pusher, hand-over
or acknowledgement.

Nothing about the lease changes (DESIGN.md 4.1-4.3): each claimed run gets a lease owner of its
own (the batch's tag plus the run's id) and every later commit is fenced on it; a process killed
after the claim leaves leases that expire, and the sweeper rings those runs (its
"claimed since the doorbell" rule) within TTL + sweep interval. A NOTIFY nobody heard (no
claimer listening, a listener reconnecting) is caught by the claimer's poll and, if no claimer
runs at all, by the sweeper's q2 doorbell for a run queued longer than its resweep time: q2
stays the at-least-once backstop. Runs queued by anything else (an approval, a yield, a retry)
keep their q2 doorbell, and a claimer may take them first (the doorbell then finds the lease
held). A run backing off has `enqueued_at` in the future: not claimable before it is due, here
or by a doorbell (`RunExecutor.claim`). A run waiting in its concurrency key's line
(`waiting_behind`, `dispatch/concurrency.py`) is not claimable at all until the end of a run
ahead of it admits it.

A running run whose lease expired (its process was killed, DESIGN.md 4.3) is re-let by the
claimers too (`relet_abandoned`, on the claimer's poll tick), beside the sweeper's q2 doorbell:
its recovery then needs neither q2's queue nor its pusher, only a live worker process with a
free slot. As with `RunExecutor.claim`, that changes the lease only, with no event.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, RunStatus
from agentruns.runtime import writer
from agentruns.runtime.events import EventSpec
from agentruns.runtime.store.batch_claims import LEASE_FREE, OWNER_ID_CHARS
from agentruns.runtime.store.rows import loaded_run, run_columns
from agentruns.runtime.store.sql import run_value
from agentruns.runtime.values.ids import worker_id

CHANNEL = "agentruns_runs"


def starts_by_notify() -> bool:
    """A start announces itself with a NOTIFY instead of a q2 doorbell (PostgreSQL, claims on)."""
    return conf.RUN_CLAIM_BATCH > 0 and connection.vendor == "postgresql"


def claim_queued(limit: int, events: list[EventSpec]) -> list[Run]:
    """Take up to `limit` due queued runs whose lease is free, the highest priority first and
    then the oldest doorbell, in one statement (the partial index `run_claim_idx` walks them in
    that order; a run waiting in its concurrency key's line is not in it)
    (autocommit: committed when it returns), appending `events` (the claim's status change,
    `transitions.started()`) to each. Returns the claimed runs as the claim left their rows
    (running, `lease_owner` theirs): the statement returns them, so the run thread that executes
    one does not read it again. The statement is the store's (`store/batch_claims.py`), written
    through the one writer."""
    if limit <= 0:
        return []
    now = timezone.now()
    return writer.claim_queued(
        limit,
        events,
        tag=f"{worker_id()}/",
        lease_expires_at=now + timedelta(seconds=conf.LEASE_TTL_SECONDS),
        now=now,
    )


def relet_abandoned(limit: int) -> list[Run]:
    """Take up to `limit` running runs whose lease expired (the process that held them died, or
    stalled past its TTL: its later commits are fenced off), in one statement, oldest expiry first.
    Only the lease changes, as in `store.relet_abandoned`: no event, the run was running and
    still is. Returns the runs as the statement left their rows, to execute on reserved slots."""
    if limit <= 0:
        return []
    now = timezone.now()
    runs = Run._meta.db_table
    sql = (
        f"WITH picked AS (SELECT id FROM {runs} WHERE status = %s AND {LEASE_FREE} "
        "ORDER BY lease_expires_at NULLS FIRST, id LIMIT %s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {runs} AS run SET lease_owner = %s || left(run.id::text, {OWNER_ID_CHARS}), "
        "lease_expires_at = %s FROM picked WHERE run.id = picked.id "
        f"RETURNING {run_columns('run')}"
    )
    params = [
        RunStatus.RUNNING,
        run_value("lease_expires_at", now),
        limit,
        f"{worker_id()}/",
        run_value("lease_expires_at", now + timedelta(seconds=conf.LEASE_TTL_SECONDS)),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [loaded_run(values, connection) for values in cursor.fetchall()]
