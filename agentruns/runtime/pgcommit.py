"""The engine's commit on PostgreSQL: one short statement, one JSON document, one function.

Why a function: an engine commit writes the run row (fenced on the lease), its events, and the
step and attempt rows of the step it records. Sent as SQL text that was several statements with
dozens of parameters: the client spent milliseconds building and binding them, and the server
parsed and planned them anew on every commit. Now the client sends the constant statement
`SELECT * FROM agentruns_commit(%s::jsonb)` with one JSON document (encoded by the C json
module), and PL/pgSQL plans the statements inside once per connection.

The function is generated from the models (`function_sql`) and installed by a migration; a test
compares the installed definition with the generated one, so a model change without a new
migration fails loudly instead of writing rows that miss a column. Elsewhere (SQLite) the engine
uses the plain-SQL path in `events.record` + `rows.WriteBatch.execute_each`.

Fencing: the run UPDATE comes first and matches only while `owner` holds the lease; when it
matches nothing the function raises SQLSTATE AR001 and the whole transaction (including a
transactional tool's writes) rolls back.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, models

from agentruns.models import Run, RunEvent, Step, StepAttempt
from agentruns.runtime.events import LeaseLost, nudge_on_commit

FUNCTION = "agentruns_commit"
LEASE_LOST_SQLSTATE = "AR001"
# the run columns an engine commit may set (`set_fields`) and add to (`incr_fields`)
RUN_SET_FIELDS = [
    "status", "lease_owner", "lease_expires_at", "enqueued_at", "cancel_requested", "step_count",
    "output", "error", "stop_reason", "started_at", "finished_at",
]
RUN_INCR_FIELDS = ["prompt_tokens", "completion_tokens", "cost_usd"]

_django_default = DjangoJSONEncoder().default


def _json_default(value: Any) -> Any:
    # full precision (DjangoJSONEncoder would cut datetimes to milliseconds)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    return _django_default(value)


def dumps(payload: Any) -> str:
    return json.dumps(payload, default=_json_default, separators=(",", ":"))


# ---------------------------------------------------------------- rows as JSON objects
_SPECS: dict[type[models.Model], tuple[list[tuple[str, str]], list[tuple[str, str, Any]], list[str]]] = {}


def _text(value: Any) -> Any:
    return str(value)


def _iso(value: Any) -> Any:
    return value.isoformat()


def _spec(model: type[models.Model]) -> tuple[list[tuple[str, str]], list[tuple[str, str, Any]], list[str]]:
    """How `row` reads a model: (column, attname) of values JSON takes as they are, (column,
    attname, to-JSON) of the others, and the attnames stamped with `now` when empty. Converting
    here keeps the JSON encoder on its C fast path."""
    spec = _SPECS.get(model)
    if spec is None:
        plain, converted, stamped = [], [], []
        for f in model._meta.concrete_fields:
            if isinstance(f, models.AutoField | models.BigAutoField):
                continue
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                stamped.append(f.attname)
            if isinstance(f, models.DateTimeField | models.DateField | models.TimeField):
                converted.append((f.column, f.attname, _iso))
            elif isinstance(f, models.UUIDField | models.DecimalField) or (
                f.is_relation and isinstance(f.target_field, models.UUIDField)
            ):
                converted.append((f.column, f.attname, _text))
            else:
                plain.append((f.column, f.attname))
        spec = _SPECS[model] = (plain, converted, stamped)
    return spec


def row(obj: models.Model, now: datetime) -> dict[str, Any]:
    """The INSERT row of `obj` (its defaults were applied when it was built)."""
    plain, converted, stamped = _spec(type(obj))
    attrs = obj.__dict__  # concrete field values live here (none is deferred on a new row)
    for attname in stamped:
        if attrs[attname] is None:
            attrs[attname] = now
    values = {column: attrs[attname] for column, attname in plain}
    for column, attname, convert in converted:
        value = attrs[attname]
        values[column] = None if value is None else convert(value)
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS  # the engine writes through the default connection
    return values


def patch(obj: models.Model, fields: list[str], key: dict[str, Any]) -> dict[str, Any]:
    """An UPDATE of `fields` of the row identified by `key` (column -> value)."""
    meta = obj._meta
    values = dict(key)
    for name in fields:
        field = meta.get_field(name)
        values[field.column] = getattr(obj, field.attname)
    return values


# ---------------------------------------------------------------- the call
def commit(
    run_id: uuid.UUID,
    owner: str | None,
    events: list[tuple[str, dict]],
    *,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
    new_run: dict[str, Any] | None = None,
    rows: dict[str, list[dict[str, Any]]] | None = None,
    now: datetime,
    end_transaction: bool = False,
) -> tuple[int, bool]:
    """Apply one engine commit; returns (last seq, cancel_requested).

    `end_transaction`: the caller's transaction.atomic() block ends right after this call, so the
    COMMIT rides in the same round trip (psycopg then skips its own COMMIT: the server is idle)."""
    payload: dict[str, Any] = {"run": str(run_id), "now": now.isoformat(), "events": events}
    if owner is not None:
        payload["owner"] = owner
    if set_fields:
        payload["set"] = set_fields
    if incr_fields:
        payload["incr"] = incr_fields
    if new_run is not None:
        payload["new_run"] = new_run
    if rows:
        payload.update({k: v for k, v in rows.items() if v})
    sql = f"SELECT * FROM {FUNCTION}(%s::jsonb)"
    if end_transaction:
        sql += "; COMMIT"
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, [dumps(payload)])
            last_seq, cancel = cursor.fetchone()
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LEASE_LOST_SQLSTATE:
            if owner is None:
                raise Run.DoesNotExist(str(run_id)) from None
            raise LeaseLost(str(run_id)) from None
        raise
    nudge_on_commit(run_id, last_seq)
    return int(last_seq), bool(cancel)


# ---------------------------------------------------------------- the function's SQL
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
        _column(f, conn) for f in model._meta.concrete_fields
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
BEGIN
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
    IF p ? 'step_updates' THEN
        UPDATE {step_t} AS t SET
            {(newline + "    ").join(_assign("t", "u.v", c, d) for c, d in step_cols)}
        FROM jsonb_array_elements(p->'step_updates') AS u(v)
        WHERE t.id = (u.v->>'id')::uuid;
    END IF;
    IF p ? 'attempts' THEN
        INSERT INTO {attempt_t} ({attempt_names})
        SELECT {attempt_names} FROM jsonb_populate_recordset(NULL::{attempt_t}, p->'attempts');
    END IF;
    IF p ? 'attempt_updates' THEN
        UPDATE {attempt_t} AS t SET
            {(newline + "    ").join(_assign("t", "u.v", c, d) for c, d in attempt_patch)}
        FROM jsonb_array_elements(p->'attempt_updates') AS u(v)
        WHERE t.step_id = (u.v->>'step_id')::uuid AND t.number = (u.v->>'number')::integer;
    END IF;
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
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(function_sql(schema_editor.connection))


def uninstall(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_SQL)
