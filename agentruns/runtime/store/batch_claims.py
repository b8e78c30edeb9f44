"""The claimers' batch statement (`dispatch/claims.py` says when and why it runs), below the
store like every other statement that writes events: queued runs leased and started in one
`FOR UPDATE SKIP LOCKED` statement, each with its status event and seq. PostgreSQL only."""

from __future__ import annotations

import json
from datetime import datetime

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

from agentruns.models import Run, RunEvent, RunStatus
from agentruns.runtime.events import EventSpec
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.store.rows import loaded_run, run_columns
from agentruns.runtime.store.sql import run_value

OWNER_ID_CHARS = 8  # of the run's id, after the batch's tag: a lease owner per claimed run
LEASE_FREE = "(lease_expires_at IS NULL OR lease_expires_at < %s)"  # %s: now


def claim_queued(
    limit: int,
    events: list[EventSpec],
    *,
    tag: str,
    lease_expires_at: datetime,
    now: datetime,
) -> list[Run]:
    """The claimers' statement (`dispatch/claims.claim_queued` says what it takes): up to
    `limit` queued runs leased to `tag` + their id until `lease_expires_at`, each with `events`
    appended, their viewers nudged (autocommit: now)."""
    runs, event_table = Run._meta.db_table, RunEvent._meta.db_table
    values = ", ".join(["(%s::int, %s::text, %s::jsonb)"] * len(events))
    stamp = run_value("updated_at", now)
    params: list = [
        RunStatus.QUEUED,
        stamp,
        stamp,
        limit,
        RunStatus.RUNNING,
        tag,
        run_value("lease_expires_at", lease_expires_at),
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
