"""The commit document: what `agentruns_commit(jsonb)` takes (`pg_function.py`), built here.

The run's fields, its events, and the batch's step and attempt rows as JSON objects keyed by
column; values are converted to what JSON holds when the row is read (`_spec`, once per model),
so the encoder never calls back into Python for them.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, models

from agentruns.models import Step, StepAttempt
from agentruns.runtime.store.rows import WriteBatch

_django_default = DjangoJSONEncoder().default


def _json_default(value: Any) -> Any:
    # full precision (DjangoJSONEncoder would cut datetimes to milliseconds)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    return _django_default(value)


def dumps(payload: Any) -> str:
    """The commit document. orjson writes it ~10x faster than the json module (~2 against
    ~29 us for a step's commit, measured), the same JSON for what the engine sends (str
    subclasses and enums as their value, datetimes and UUIDs as their text); what orjson refuses
    (an int past 64 bits, a lone surrogate) goes through the json module as before."""
    try:
        return orjson.dumps(payload, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(payload, default=_json_default, separators=(",", ":"))


# ---------------------------------------------------------------- rows as JSON objects
_SPECS: dict[
    type[models.Model], tuple[list[tuple[str, str]], list[tuple[str, str, Any]], list[str]]
] = {}


def _text(value: Any) -> Any:
    return str(value)


def _spec(
    model: type[models.Model],
) -> tuple[list[tuple[str, str]], list[tuple[str, str, Any]], list[str]]:
    """How `row` reads a model: (column, attname) of values JSON takes as they are, (column,
    attname, to-JSON) of the others, and the attnames stamped with `now` when empty. orjson
    writes datetimes and UUIDs itself, as their `isoformat()` and `str()` (what the json module's
    fallback writes too); only decimals are converted here, which keeps it off the Python
    callback."""
    spec = _SPECS.get(model)
    if spec is None:
        plain, converted, stamped = [], [], []
        for f in model._meta.concrete_fields:
            if isinstance(f, models.AutoField | models.BigAutoField):
                continue
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                stamped.append(f.attname)
            if isinstance(f, models.DecimalField):
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


def batch_rows(batch: WriteBatch, now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The batch as the function takes it: steps, attempts, step_updates, attempt_updates."""
    out: dict[str, list[dict[str, Any]]] = {
        "steps": [],
        "attempts": [],
        "step_updates": [],
        "attempt_updates": [],
    }
    for obj in batch.inserts:
        kind = (
            "steps"
            if isinstance(obj, Step)
            else "attempts"
            if isinstance(obj, StepAttempt)
            else None
        )
        if kind is None:
            raise TypeError(f"WriteBatch cannot insert {type(obj).__name__} on PostgreSQL")
        out[kind].append(row(obj, now))
    for obj, fields, where in batch.updates:
        if isinstance(obj, Step) and where is None:
            out["step_updates"].append(patch(obj, fields, {"id": obj.pk}))
        elif (
            isinstance(obj, StepAttempt) and where is not None and set(where) == {"step", "number"}
        ):
            out["attempt_updates"].append(
                patch(obj, fields, {"step_id": where["step"], "number": where["number"]})
            )
        else:
            raise TypeError(
                f"WriteBatch cannot update {type(obj).__name__} by {where} on PostgreSQL"
            )
    return {k: v for k, v in out.items() if v}
