"""Plain SQL for the store's writes (the SQLite store; PostgreSQL's CTE statements reuse the run
UPDATE). `insert_sql` replaces `bulk_create`, which spends milliseconds per call on bookkeeping
the engine does not need: it knows its primary keys, needs no returned ids, never conflicts."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models
from django.utils import timezone

from agentruns.models import Run, RunEvent, RunStatus
from agentruns.runtime.events import EventSpec


def _fields(model: type[models.Model]) -> list[models.Field]:
    return [
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and isinstance(f, models.AutoField | models.BigAutoField))
    ]


def insert_sql(objs: Sequence[models.Model]) -> tuple[str, list[Any]]:
    model = type(objs[0])
    fields = _fields(model)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params: list[Any] = []
    for obj in objs:
        for field in fields:
            params.append(field.get_db_prep_save(field.pre_save(obj, add=True), connection))
        obj._state.adding = False
        obj._state.db = connection.alias
    return (
        f"INSERT INTO {model._meta.db_table} ({columns}) VALUES {', '.join([row] * len(objs))}",
        params,
    )


def update_sql(
    obj: models.Model, fields: Sequence[str], where: dict[str, Any] | None = None
) -> tuple[str, list[Any]]:
    """UPDATE of `fields` of one row, by primary key (or by `where` columns)."""
    meta = obj._meta
    sets, params = [], []
    for name in fields:
        field = meta.get_field(name)
        sets.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(field.get_db_prep_save(field.pre_save(obj, add=False), connection))
    where = where or {meta.pk.name: obj.pk}
    conds = []
    for name, value in where.items():
        field = meta.get_field(name)
        conds.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(field.get_db_prep_value(value, connection, prepared=False))
    return f"UPDATE {meta.db_table} SET {', '.join(sets)} WHERE {' AND '.join(conds)}", params


def run_value(field_name: str, value: Any) -> Any:
    """A value of a Run field as the database takes it."""
    return Run._meta.get_field(field_name).get_db_prep_save(value, connection)


def run_update_sql(
    run_id: uuid.UUID | str,
    n_events: int,
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
    default_fields: dict[str, Any] | None = None,
    where: tuple[str, list[Any]] | None = None,
) -> tuple[str, list[Any]]:
    """UPDATE of the run row that allocates `n_events` seqs; RETURNING (last_seq,
    cancel_requested). Fenced on `lease_owner` when given; `default_fields` are set only where
    still NULL; `where` adds a condition."""
    assignments = ["last_seq = last_seq + %s"]
    params: list[Any] = [n_events]
    for name, value in (set_fields or {}).items():
        assignments.append(f"{Run._meta.get_field(name).column} = %s")
        params.append(run_value(name, value))
    for name, value in (default_fields or {}).items():
        column = Run._meta.get_field(name).column
        assignments.append(f"{column} = COALESCE({column}, %s)")
        params.append(run_value(name, value))
    for name, delta in (incr_fields or {}).items():
        column = Run._meta.get_field(name).column
        assignments.append(f"{column} = {column} + %s")
        params.append(delta)
    assignments.append("updated_at = %s")
    params.append(run_value("updated_at", timezone.now()))
    condition = "id = %s"
    params.append(run_value("id", run_id))
    if lease_owner is not None:
        condition += " AND lease_owner = %s"
        params.append(lease_owner)
    if where is not None:
        condition += f" AND ({where[0]})"
        params.extend(where[1])
    sql = (
        f"UPDATE {Run._meta.db_table} SET {', '.join(assignments)} WHERE {condition} "
        "RETURNING last_seq, cancel_requested"
    )
    return sql, params


def events_insert_sql(
    run_id: uuid.UUID | str, last_seq: int, events: Sequence[EventSpec]
) -> tuple[str, list[Any]]:
    """INSERT of events whose seqs end at `last_seq` (allocated by the run UPDATE)."""
    first = last_seq - len(events) + 1
    now = run_value("updated_at", timezone.now())
    run = run_value("id", run_id)
    rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(events))
    params: list[Any] = []
    for i, (etype, data) in enumerate(events):
        params += [run, first + i, str(etype), json.dumps(data, cls=DjangoJSONEncoder), now]
    return (
        f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, data, created_at) VALUES {rows}",
        params,
    )


# a run in flight counts against its starter's cap (AGENTRUNS_RUNS_IN_FLIGHT_PER_USER)
IN_FLIGHT_STATUSES = (RunStatus.QUEUED.value, RunStatus.RUNNING.value)


def in_flight_count_sql() -> str:
    """How many runs of a user (the first parameter) are queued or running, counted up to a
    limit (the second): the in-flight cap's count, reading no further than what decides it."""
    table = connection.ops.quote_name(Run._meta.db_table)
    by = connection.ops.quote_name(Run._meta.get_field("created_by").column)
    status = connection.ops.quote_name(Run._meta.get_field("status").column)
    statuses = ", ".join(f"'{s}'" for s in IN_FLIGHT_STATUSES)
    return (
        f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {by} = %s "
        f"AND {status} IN ({statuses}) LIMIT %s) AS in_flight"
    )
