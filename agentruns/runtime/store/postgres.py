"""The PostgreSQL store: an engine commit is one call of `agentruns_commit(jsonb)`.

The client sends the constant statement `SELECT * FROM agentruns_commit(%s::jsonb)` with one
JSON document (`documents.py`); the function (`pg_function.py`) writes the fenced run update,
the events and the batch's step and attempt rows. Unfenced appends and the lease claim are one
statement each: the run UPDATE and the event INSERT as a data-modifying CTE.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import psycopg
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.utils import timezone

from agentruns.models import Run, RunEvent, RunStatus
from agentruns.runtime.events import EventSpec, LeaseLost
from agentruns.runtime.store.base import (
    InFlightCap,
    InFlightCapReached,
    InFlightNearCap,
    RunDeltas,
    RunStore,
)
from agentruns.runtime.store.documents import batch_rows, dumps, row
from agentruns.runtime.store.nudges import nudge_on_commit, nudge_runs_on_commit
from agentruns.runtime.store.pg_function import (
    FUNCTION,
    IN_FLIGHT_CAP_SQLSTATE,
    IN_FLIGHT_NEAR_SQLSTATE,
    LEASE_LOST_SQLSTATE,
)
from agentruns.runtime.store.rows import loaded_run, run_columns
from agentruns.runtime.store.sql import run_update_sql, run_value


def call_function(
    run_id: uuid.UUID,
    owner: str | None,
    events: list[EventSpec],
    *,
    now: datetime,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
    new_run: dict[str, Any] | None = None,
    rows: dict[str, list[dict[str, Any]]] | None = None,
    end_transaction: bool = False,
    notify: str | None = None,
    in_flight: InFlightCap | None = None,
) -> tuple[int, bool]:
    """One call of the commit function; returns (last seq, cancel_requested).

    `end_transaction`: the caller's transaction.atomic() block ends right after this call, so the
    COMMIT rides in the same round trip (psycopg then skips its own COMMIT: the server is idle).
    `notify`: a channel the same statement NOTIFYs (sent when its transaction commits).
    `in_flight`: a new run's cap, checked by the function (InFlightCapReached: nothing written;
    InFlightNearCap: a shared start near the cap, nothing written, to be made again exclusive)."""
    payload: dict[str, Any] = {"run": str(run_id), "now": now.isoformat(), "events": events}
    if owner is not None:
        payload["owner"] = owner
    if set_fields:
        payload["set"] = set_fields
    if incr_fields:
        payload["incr"] = incr_fields
    if new_run is not None:
        payload["new_run"] = new_run
    if in_flight is not None:
        payload["in_flight"] = {
            "user": str(in_flight.user_id),
            "limit": in_flight.limit,
            "shared": in_flight.shared,
        }
    if rows:
        payload.update(rows)
    try:
        last_seq, cancel = _execute_call(dumps(payload), end_transaction, notify)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == IN_FLIGHT_CAP_SQLSTATE:
            raise InFlightCapReached(str(in_flight.user_id if in_flight else "")) from None
        if getattr(exc.__cause__, "sqlstate", None) == IN_FLIGHT_NEAR_SQLSTATE:
            raise InFlightNearCap(str(in_flight.user_id if in_flight else "")) from None
        if getattr(exc.__cause__, "sqlstate", None) == LEASE_LOST_SQLSTATE:
            if owner is None:
                raise Run.DoesNotExist(str(run_id)) from None
            raise LeaseLost(str(run_id)) from None
        raise
    nudge_on_commit(run_id, last_seq)
    return int(last_seq), bool(cancel)


CALL_SQL = f"SELECT * FROM {FUNCTION}(%s::jsonb)"


def _execute_call(
    document: str, end_transaction: bool, notify: str | None = None
) -> tuple[int, bool]:
    """The commit function on `document`. The statement is constant, so it is bound on the server
    and prepared once per connection (psycopg's cursor, not Django's client-side one: no quoting
    of a kilobytes-long JSON literal, no parse per call). With `end_transaction` the COMMIT rides
    along, and two statements in one round trip take the client-side path, as does a start that
    NOTIFYs the claimers in the same statement (through Django's cursor: it is one start, and
    the query log counts it)."""
    db = connections[DEFAULT_DB_ALIAS]
    if notify is not None:
        sql = f"SELECT f.* FROM {FUNCTION}(%s::jsonb) AS f, pg_notify(%s, '') AS n"
        with db.cursor() as cursor:
            cursor.execute(sql + ("; COMMIT" if end_transaction else ""), [document, notify])
            return cursor.fetchone()
    if end_transaction:
        return _fetch(CALL_SQL_COMMIT, [document], client=True)[0]
    return _fetch(CALL_SQL, [document])[0]


def _fetch(sql: str, params: list[Any], *, client: bool = False) -> list[tuple]:
    """The rows of `sql` on this thread's connection, through a kept cursor: prepared once per
    connection (a constant statement), or bound client-side (`client`: several statements).
    psycopg's errors come out as Django's (the cause kept), as from a Django cursor."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        prepared, client_cursor = _kept_cursors(db)
        if client:
            client_cursor.execute(sql, params)
            return client_cursor.fetchall()
        prepared.execute(sql, params, prepare=True)
        return prepared.fetchall()


CALL_SQL_COMMIT = CALL_SQL + "; COMMIT"


def _kept_cursors(db: Any) -> tuple[psycopg.Cursor, psycopg.ClientCursor]:
    """The commit's two cursors of the thread's current connection, made once per connection:
    building a psycopg cursor (its transformer, its result loaders) per commit was half the
    client CPU of the call (~40 of ~80 us, measured). A new connection (pooled, reconnected)
    gets new ones; a cursor is only ever used by the thread whose wrapper holds its connection."""
    conn = db.connection
    kept = db.__dict__.get("_agentruns_commit_cursors")
    if kept is None or kept[0] is not conn:
        kept = (conn, psycopg.Cursor(conn), psycopg.ClientCursor(conn))
        db._agentruns_commit_cursors = kept
    return kept[1], kept[2]


def _outermost_atomic(db: Any) -> bool:
    # the COMMIT may ride along only when this is the outermost atomic block, no savepoints
    return db.in_atomic_block and not db.savepoint_ids and len(db.atomic_blocks) == 1


def record_statement(
    run_id: uuid.UUID | str,
    events: list[EventSpec],
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
    default_fields: dict[str, Any] | None = None,
    where: tuple[str, list[Any]] | None = None,
) -> tuple[str, list[Any]]:
    """The run UPDATE and the event INSERT as ONE statement (a data-modifying CTE). Its rows are
    `(seq, cancel_requested)`, none when the run (or the lease) is gone or `where` does not hold."""
    update, params = run_update_sql(
        run_id,
        len(events),
        lease_owner=lease_owner,
        set_fields=set_fields,
        incr_fields=incr_fields,
        default_fields=default_fields,
        where=where,
    )
    values = ", ".join(["(%s::int, %s::text, %s::jsonb)"] * len(events))
    for i, (etype, data) in enumerate(events):
        params += [i, str(etype), json.dumps(data, cls=DjangoJSONEncoder)]
    params += [run_value("id", run_id), len(events) - 1, run_value("updated_at", timezone.now())]
    sql = (
        f"WITH r AS ({update}), v(i, t, d) AS (VALUES {values}) "
        f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, data, created_at) "
        "SELECT %s, r.last_seq - %s + v.i, v.t, v.d, %s FROM r, v "
        "RETURNING seq, (SELECT cancel_requested FROM r)"
    )
    return sql, params


_RUN_T, _EVENT_T = Run._meta.db_table, RunEvent._meta.db_table
# the deltas of many runs as ONE statement: each run's seqs bumped (fenced on its lease, which is
# renewed) and its events inserted; a run whose lease moved matches nothing and writes nothing
DELTAS_SQL = f"""
WITH d AS (
    SELECT * FROM jsonb_to_recordset(%s::jsonb)
        AS d(run uuid, owner text, lease timestamptz, events jsonb)
), r AS (
    UPDATE {_RUN_T} AS r SET
        last_seq = r.last_seq + jsonb_array_length(d.events),
        lease_expires_at = d.lease,
        updated_at = %s
    FROM d WHERE r.id = d.run AND r.lease_owner = d.owner
    RETURNING r.id, r.last_seq, r.cancel_requested, d.events
), e AS (
    INSERT INTO {_EVENT_T} (run_id, seq, type, data, created_at)
    SELECT r.id, r.last_seq - jsonb_array_length(r.events) + x.i, x.v->>0, x.v->1, %s
    FROM r, jsonb_array_elements(r.events) WITH ORDINALITY AS x(v, i)
)
SELECT id, last_seq, cancel_requested FROM r
"""


# the run row by id: a constant statement, prepared once per connection (the ORM's `get` compiled
# its SQL anew every time: ~4x the CPU, measured)
LOAD_RUN_SQL = f"SELECT {run_columns(_RUN_T)} FROM {_RUN_T} WHERE id = %s"


class PostgresStore(RunStore):
    create_is_one_statement = True

    def commit(
        self,
        run_id,
        owner,
        events,
        *,
        now,
        set_fields=None,
        incr_fields=None,
        batch=None,
        end_transaction=False,
    ) -> tuple[int, bool]:
        db = connections[DEFAULT_DB_ALIAS]  # one lookup through the thread-local proxy, not five
        return call_function(
            run_id,
            owner,
            events,
            now=now,
            set_fields=set_fields,
            incr_fields=incr_fields,
            rows=batch_rows(batch, now) if batch is not None else None,
            end_transaction=end_transaction and _outermost_atomic(db),
        )

    def load_run(self, run_id: uuid.UUID) -> Run:
        found = _fetch(LOAD_RUN_SQL, [uuid.UUID(str(run_id))])
        if not found:
            raise Run.DoesNotExist(f"run {run_id} does not exist")
        return loaded_run(found[0], connections[DEFAULT_DB_ALIAS])

    def commit_deltas(
        self, deltas: list[RunDeltas], *, now: datetime
    ) -> dict[uuid.UUID, tuple[int, bool]]:
        # in run order: two writers that ever share a run take its row lock in the same order
        payload = [
            {
                "run": str(d.run_id),
                "owner": d.owner,
                "lease": d.lease_expires_at.isoformat(),
                "events": d.events,
            }
            for d in sorted(deltas, key=lambda d: d.run_id)
        ]
        # a constant statement: prepared once per connection, not parsed and planned per tick
        rows = _fetch(DELTAS_SQL, [dumps(payload), now, now])
        done = {run_id: (int(last_seq), bool(cancel)) for run_id, last_seq, cancel in rows}
        nudge_runs_on_commit([(run_id, seq) for run_id, (seq, _) in done.items()])
        return done

    def append(self, run_id, events, *, set_fields=None, incr_fields=None) -> int:
        if not events:
            sql, params = run_update_sql(run_id, 0, set_fields=set_fields, incr_fields=incr_fields)
        else:
            sql, params = record_statement(
                run_id, events, set_fields=set_fields, incr_fields=incr_fields
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not rows:
            raise Run.DoesNotExist(str(run_id))
        last_seq = max(int(r[0]) for r in rows)
        if events:
            nudge_on_commit(run_id, last_seq)
        return last_seq

    def create_run(self, run, events, *, owner, now, notify=None, in_flight=None) -> int:
        last_seq, _ = call_function(
            run.id,
            owner,
            events,
            now=now,
            new_run=row(run, now),
            notify=notify,
            in_flight=in_flight,
        )
        return last_seq

    def claim(self, run_id, owner, events, *, lease, now) -> bool:
        if connection.in_atomic_block:  # inside a caller's transaction: the generic path
            return super().claim(run_id, owner, events, lease=lease, now=now)
        # the common case in one round trip: queued -> running, the lease, and its event
        sql, params = record_statement(
            run_id,
            events,
            set_fields={"status": RunStatus.RUNNING, **lease},
            default_fields={"started_at": now},
            where=(
                "status = %s AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
                "AND waiting_behind IS NULL "  # not waiting in its concurrency key's line
                # due: a doorbell left over from before a back-off must not cut the wait short
                "AND (enqueued_at IS NULL OR enqueued_at <= %s)",
                [RunStatus.QUEUED, now, now],
            ),
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if rows:
            nudge_on_commit(run_id, max(int(r[0]) for r in rows))
            return True
        return self.relet_abandoned(run_id, lease=lease, now=now)
