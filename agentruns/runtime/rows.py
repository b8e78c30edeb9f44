"""Lean writes for the engine's hot path.

`insert_sql` replaces `bulk_create` (which spends milliseconds per call on bookkeeping the engine
does not need: it knows its primary keys, needs no returned ids, never conflicts).

`WriteBatch` collects the step and attempt rows of one engine commit: on PostgreSQL they go to
the commit function as JSON (`pgcommit.py`), elsewhere (SQLite) as these statements, one by one
inside `transaction.atomic()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models.base import ModelState

M = TypeVar("M", bound=models.Model)


_BUILD_SPECS: dict[type[models.Model], tuple[dict[str, Any], list[tuple[str, Any]]]] = {}


def _build_spec(model: type[models.Model]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    static: dict[str, Any] = {}
    dynamic: list[tuple[str, Any]] = []
    for f in model._meta.concrete_fields:
        if f.has_default() and callable(f.default):
            dynamic.append((f.attname, f.default))
        else:  # a constant (Django refuses mutable constants as defaults), or None/""
            static[f.attname] = f.get_default()
    return static, dynamic


def build(model: type[M], related: dict[str, models.Model] | None = None, **values: Any) -> M:
    """A new, unsaved instance of `model` without `Model.__init__` (the engine builds ~15 per
    run; __init__'s generic keyword handling was ~8% of its CPU). `values` are keyed by attname
    (`step_id`, not `step`); `related` pre-fills the cache of relations given as objects. No
    pre_init/post_init signals are sent: none are connected for these models."""
    spec = _BUILD_SPECS.get(model)
    if spec is None:
        spec = _BUILD_SPECS[model] = _build_spec(model)
    static, dynamic = spec
    unknown = values.keys() - static.keys() - {attname for attname, _ in dynamic}
    if unknown:
        raise TypeError(f"{model.__name__} has no fields {sorted(unknown)}")
    obj = model.__new__(model)
    obj._state = ModelState()
    attrs = obj.__dict__
    attrs.update(static)
    for attname, default in dynamic:
        if attname not in values:
            attrs[attname] = default()
    attrs.update(values)
    for name, instance in (related or {}).items():
        obj._state.fields_cache[name] = instance
    return obj


def _fields(model: type[models.Model]) -> list[models.Field]:
    return [
        f for f in model._meta.concrete_fields
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
    return f"INSERT INTO {model._meta.db_table} ({columns}) VALUES {', '.join([row] * len(objs))}", params


def update_sql(obj: models.Model, fields: Sequence[str], where: dict[str, Any] | None = None) -> tuple[str, list[Any]]:
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


class WriteBatch:
    """The step and attempt rows of one engine commit, written with the run update.

    On PostgreSQL they travel as JSON rows to `pgcommit.commit` (one statement); elsewhere
    `execute_each` runs them one statement at a time inside the caller's transaction."""

    def __init__(self) -> None:
        self.inserts: list[models.Model] = []
        self.updates: list[tuple[models.Model, list[str], dict[str, Any] | None]] = []

    def insert(self, objs: Sequence[models.Model]) -> WriteBatch:
        self.inserts.extend(objs)
        return self

    def update(self, obj: models.Model, fields: Sequence[str], where: dict[str, Any] | None = None) -> WriteBatch:
        self.updates.append((obj, list(fields), where))
        return self

    def json_rows(self, now: datetime) -> dict[str, list[dict[str, Any]]]:
        """For `pgcommit.commit`: steps, attempts, step_updates, attempt_updates."""
        from agentruns.models import Step, StepAttempt
        from agentruns.runtime.pgcommit import patch, row

        out: dict[str, list[dict[str, Any]]] = {
            "steps": [], "attempts": [], "step_updates": [], "attempt_updates": [],
        }
        for obj in self.inserts:
            kind = "steps" if isinstance(obj, Step) else "attempts" if isinstance(obj, StepAttempt) else None
            if kind is None:
                raise TypeError(f"WriteBatch cannot insert {type(obj).__name__} on PostgreSQL")
            out[kind].append(row(obj, now))
        for obj, fields, where in self.updates:
            if isinstance(obj, Step) and where is None:
                out["step_updates"].append(patch(obj, fields, {"id": obj.pk}))
            elif isinstance(obj, StepAttempt) and where is not None and set(where) == {"step", "number"}:
                key = {"step_id": where["step"], "number": where["number"]}
                out["attempt_updates"].append(patch(obj, fields, key))
            else:
                raise TypeError(f"WriteBatch cannot update {type(obj).__name__} by {where} on PostgreSQL")
        return out

    def execute_each(self) -> None:
        """Anywhere else: one statement at a time (the caller holds the transaction)."""
        statements = []
        by_model: dict[type[models.Model], list[models.Model]] = {}
        for obj in self.inserts:
            by_model.setdefault(type(obj), []).append(obj)
        statements += [insert_sql(objs) for objs in by_model.values()]
        statements += [update_sql(obj, fields, where) for obj, fields, where in self.updates]
        with connection.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)


def insert_rows(objs: Sequence[models.Model]) -> None:
    if objs:
        sql, params = insert_sql(objs)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
