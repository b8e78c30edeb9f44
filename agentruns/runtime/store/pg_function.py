"""`agentruns_commit(jsonb)`: the engine's commit as one PL/pgSQL function, generated from the models.

An engine commit writes the run row (fenced on the lease), its events, and the step and attempt
rows of the step it records. Sent as SQL text that was several statements with dozens of
parameters: the client spent milliseconds building and binding them, and the server parsed and
planned them anew on every commit. The function takes one JSON document and PL/pgSQL plans the
statements inside once per connection.

Installed by migrations (0005, and again by any migration that changes the columns of Run, Step
or StepAttempt: `CREATE OR REPLACE`); `tests/runtime/test_pg_function.py` compares the installed
definition with `function_sql`, so a model change without such a migration fails loudly.

A start with an in-flight cap (`in_flight`: the user and the limit) first takes an advisory lock
of its transaction keyed on the user, then counts that user's runs queued or running: the count
is a statement of its own inside the function, so its snapshot is taken after the lock was
granted and sees the run of every start that held the lock before (their transactions have
committed: the lock ends with them). At the limit it raises SQLSTATE AR002 and writes nothing.

That lock is held until the start commits, so one user's starts would wait for each other's
commits however far below the cap they are (a client starting a batch through the API: 42 ms
a start in `benchmarks.deployment`'s batch of 100). A start that is alone in its transaction
(`shared`) takes the lock shared instead: such starts do not wait for each other, and one that
counts exactly (exclusive: a start inside a caller's transaction, which may hold others) waits
for them all to commit, and they for it. A shared start cannot see the runs of the others in
flight, but each of them is one run on a connection of its own, so at most the server's
`max_connections` runs are uncounted: when its count plus that could reach the limit, it raises
SQLSTATE AR003, writes nothing, and the caller starts again exclusive, counting exactly.

Fencing: the run UPDATE comes first and matches only while `owner` holds the lease; when it
matches nothing the function raises SQLSTATE AR001 and the whole transaction (including a
transactional tool's writes) rolls back.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from agentruns.models import Run, RunEvent, Step, StepAttempt
from agentruns.runtime.store.sql import IN_FLIGHT_STATUSES

FUNCTION = "agentruns_commit"
LEASE_LOST_SQLSTATE = "AR001"
IN_FLIGHT_CAP_SQLSTATE = "AR002"
IN_FLIGHT_NEAR_SQLSTATE = "AR003"  # a shared start near its cap: count again, exclusive
# the advisory lock a start takes per user while it counts that user's runs in flight
IN_FLIGHT_LOCK = "agentruns.in_flight:"
# the run columns an engine commit may set (`set_fields`) and add to (`incr_fields`)
RUN_SET_FIELDS = [
    "status",
    "lease_owner",
    "lease_expires_at",
    "enqueued_at",
    "cancel_requested",
    "step_count",
    "output",
    "output_data",
    "error",
    "stop_reason",
    "outcome",
    "started_at",
    "finished_at",
]
RUN_INCR_FIELDS = ["prompt_tokens", "completion_tokens", "cost_usd"]


def _column(field: models.Field, conn: Any) -> tuple[str, str]:
    return field.column, field.db_type(conn)


def _value(source: str, column: str, db_type: str) -> str:
    if db_type == "jsonb":
        return f"nullif({source}->'{column}', 'null'::jsonb)"
    return f"({source}->>'{column}')::{db_type}"


def _assign(target: str, source: str, column: str, db_type: str) -> str:
    return f"{column} = CASE WHEN {source} ? '{column}' THEN {_value(source, column, db_type)} ELSE {target}.{column} END"


def _fields(model: type[models.Model], conn: Any, exclude: set[str]) -> list[tuple[str, str]]:
    return [
        _column(f, conn)
        for f in model._meta.concrete_fields
        if f.column not in exclude and not isinstance(f, models.AutoField | models.BigAutoField)
    ]


def function_sql(conn: Any) -> str:
    run_t, step_t = Run._meta.db_table, Step._meta.db_table
    attempt_t, event_t = StepAttempt._meta.db_table, RunEvent._meta.db_table
    run_sets = [
        _assign("r", "v_set", *_column(Run._meta.get_field(name), conn)) for name in RUN_SET_FIELDS
    ]
    run_incr = []
    for name in RUN_INCR_FIELDS:
        column, db_type = _column(Run._meta.get_field(name), conn)
        run_incr.append(f"{column} = r.{column} + coalesce((v_incr->>'{column}')::{db_type}, 0)")
    step_cols = _fields(Step, conn, {"id"})
    attempt_cols = _fields(StepAttempt, conn, set())
    attempt_names = ", ".join(c for c, _ in attempt_cols)
    attempt_patch = [c for c in attempt_cols if c[0] not in {"step_id", "number"}]
    newline = ",\n        "
    created_by, created_by_type = _column(Run._meta.get_field("created_by"), conn)
    status = Run._meta.get_field("status").column
    in_flight_count = f"SELECT count(*) FROM (SELECT 1 FROM {run_t}"
    in_flight_statuses = ", ".join(f"'{status}'" for status in IN_FLIGHT_STATUSES)
    return f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(p jsonb)
RETURNS TABLE (out_seq bigint, out_cancel boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_run uuid := (p->>'run')::uuid;
    v_now timestamptz := (p->>'now')::timestamptz;
    v_set jsonb := coalesce(p->'set', '{{}}'::jsonb);
    v_incr jsonb := coalesce(p->'incr', '{{}}'::jsonb);
    v_n integer := coalesce(jsonb_array_length(p->'events'), 0);
    v_seq bigint;
    v_cancel boolean;
    v_u jsonb;
BEGIN
    IF p ? 'in_flight' AND (p->'in_flight'->>'shared')::boolean THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('{IN_FLIGHT_LOCK}' || (p->'in_flight'->>'user'), 0));
        IF ({in_flight_count} WHERE {created_by} = (p->'in_flight'->>'user')::{created_by_type}
                AND {status} IN ({in_flight_statuses}) LIMIT (p->'in_flight'->>'limit')::integer) AS f)
                + current_setting('max_connections')::integer > (p->'in_flight'->>'limit')::integer THEN
            RAISE EXCEPTION USING ERRCODE = '{IN_FLIGHT_NEAR_SQLSTATE}',
                MESSAGE = 'runs in flight: near ' || (p->'in_flight'->>'limit') || ', counted exactly';
        END IF;
    ELSIF p ? 'in_flight' THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('{IN_FLIGHT_LOCK}' || (p->'in_flight'->>'user'), 0));
        IF ({in_flight_count} WHERE {created_by} = (p->'in_flight'->>'user')::{created_by_type}
                AND {status} IN ({in_flight_statuses}) LIMIT (p->'in_flight'->>'limit')::integer) AS f)
                >= (p->'in_flight'->>'limit')::integer THEN
            RAISE EXCEPTION USING ERRCODE = '{IN_FLIGHT_CAP_SQLSTATE}',
                MESSAGE = 'runs in flight: ' || (p->'in_flight'->>'limit') || ' already';
        END IF;
    END IF;
    IF p ? 'new_run' THEN
        INSERT INTO {run_t} SELECT * FROM jsonb_populate_record(NULL::{run_t}, p->'new_run');
    END IF;
    UPDATE {run_t} AS r SET
        last_seq = r.last_seq + v_n,
        updated_at = v_now,
        {newline.join(run_sets)},
        {newline.join(run_incr)}
    WHERE r.id = v_run AND (NOT p ? 'owner' OR r.lease_owner = p->>'owner')
    RETURNING r.last_seq, r.cancel_requested INTO v_seq, v_cancel;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{LEASE_LOST_SQLSTATE}',
            MESSAGE = 'run ' || v_run || ' is gone or its lease moved to another worker';
    END IF;
    IF p ? 'steps' THEN
        INSERT INTO {step_t} SELECT * FROM jsonb_populate_recordset(NULL::{step_t}, p->'steps');
    END IF;
    -- an update per row by its key (a loop, not UPDATE ... FROM jsonb_array_elements): the
    -- join's generic plan scanned the whole table, a cost that grew with every run stored
    FOR v_u IN SELECT u.v FROM jsonb_array_elements(p->'step_updates') AS u(v) LOOP
        UPDATE {step_t} AS t SET
            {(newline + "    ").join(_assign("t", "v_u", c, d) for c, d in step_cols)}
        WHERE t.id = (v_u->>'id')::uuid;
    END LOOP;
    IF p ? 'attempts' THEN
        INSERT INTO {attempt_t} ({attempt_names})
        SELECT {attempt_names} FROM jsonb_populate_recordset(NULL::{attempt_t}, p->'attempts');
    END IF;
    FOR v_u IN SELECT u.v FROM jsonb_array_elements(p->'attempt_updates') AS u(v) LOOP
        UPDATE {attempt_t} AS t SET
            {(newline + "    ").join(_assign("t", "v_u", c, d) for c, d in attempt_patch)}
        WHERE t.step_id = (v_u->>'step_id')::uuid AND t.number = (v_u->>'number')::integer;
    END LOOP;
    IF v_n > 0 THEN
        INSERT INTO {event_t} (run_id, seq, type, data, created_at)
        SELECT v_run, v_seq - v_n + e.i, e.v->>0, e.v->1, v_now
        FROM jsonb_array_elements(p->'events') WITH ORDINALITY AS e(v, i);
    END IF;
    RETURN QUERY SELECT v_seq, v_cancel;
END
$fn$;
"""


DROP_SQL = f"DROP FUNCTION IF EXISTS {FUNCTION}(jsonb)"


def install(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":  # nothing to install on SQLite
        schema_editor.execute(function_sql(schema_editor.connection))


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":  # nothing to install on SQLite
        schema_editor.execute(DROP_SQL)
