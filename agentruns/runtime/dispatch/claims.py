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
held). A run backing off has `enqueued_at` in the future: not claimable before it is due. A run
waiting in its concurrency key's line (`waiting_behind`, `dispatch/concurrency.py`) is not
claimable at all until the end of a run ahead of it admits it.

A running run whose lease expired (its process was killed, DESIGN.md 4.3) is re-let by the
claimers too (`relet_abandoned`, on the claimer's poll tick), beside the sweeper's q2 doorbell:
its recovery then needs neither q2's queue nor its pusher, only a live worker process with a
free slot. As with `RunExecutor.claim`, that changes the lease only, with no event.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, RunEvent, RunStatus
from agentruns.runtime.events import EventSpec
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.store.rows import loaded_run, run_columns
from agentruns.runtime.store.sql import run_value
from agentruns.runtime.values.ids import worker_id

CHANNEL = "agentruns_runs"
OWNER_ID_CHARS = 8  # of the run's id, after the batch's tag: a lease owner per claimed run
LEASE_FREE = "(lease_expires_at IS NULL OR lease_expires_at < %s)"  # %s: now


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
    one does not read it again."""
    if limit <= 0:
        return []
    now = timezone.now()
    tag = worker_id()
    runs, event_table = Run._meta.db_table, RunEvent._meta.db_table
    values = ", ".join(["(%s::int, %s::text, %s::jsonb)"] * len(events))
    stamp = run_value("updated_at", now)
    params: list = [
        RunStatus.QUEUED,
        stamp,
        stamp,
        limit,
        RunStatus.RUNNING,
        f"{tag}/",
        run_value("lease_expires_at", now + timedelta(seconds=conf.LEASE_TTL_SECONDS)),
        stamp,
        len(events),
        stamp,
    ]
    for i, (etype, data) in enumerate(events):
        params += [i, str(etype), json.dumps(data, cls=DjangoJSONEncoder)]
    params += [len(events) - 1, stamp]
    sql = (
        f"WITH picked AS (SELECT id FROM {runs} WHERE status = %s AND {LEASE_FREE} "
        "AND enqueued_at <= %s AND waiting_behind IS NULL "
        "ORDER BY priority DESC, enqueued_at, id LIMIT %s FOR UPDATE SKIP LOCKED), "
        f"r AS (UPDATE {runs} AS run SET status = %s, "
        f"lease_owner = %s || left(run.id::text, {OWNER_ID_CHARS}), lease_expires_at = %s, "
        "started_at = COALESCE(run.started_at, %s), last_seq = run.last_seq + %s, "
        f"updated_at = %s FROM picked WHERE run.id = picked.id RETURNING {run_columns('run')}), "
        f"v(i, t, d) AS (VALUES {values}), "
        f"e AS (INSERT INTO {event_table} (run_id, seq, type, data, created_at) "
        "SELECT r.id, r.last_seq - %s + v.i, v.t, v.d, %s FROM r, v) "
        f"SELECT {run_columns('r')} FROM r"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        runs_claimed = [loaded_run(values, connection) for values in cursor.fetchall()]
    for run in runs_claimed:
        nudge_on_commit(run.id, run.last_seq)  # autocommit: sent now (last_seq: its last event)
    return runs_claimed


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
