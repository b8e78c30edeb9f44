"""Rows for the engine's hot path: built without `Model.__init__`, collected per commit.

`WriteBatch` collects the step and attempt rows of one engine commit; the store writes them with
the run update (PostgreSQL: as JSON to the commit function; SQLite: one statement each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, models
from django.db.models.base import ModelState

from agentruns.models import Run

M = TypeVar("M", bound=models.Model)


_BuildSpec = tuple[dict[str, Any], list[tuple[str, Any]], frozenset[str]]
_BUILD_SPECS: dict[type[models.Model], _BuildSpec] = {}


def _build_spec(model: type[models.Model]) -> _BuildSpec:
    static: dict[str, Any] = {}
    dynamic: list[tuple[str, Any]] = []
    for f in model._meta.concrete_fields:
        if f.has_default() and callable(f.default):
            dynamic.append((f.attname, f.default))
        else:  # a constant (Django refuses mutable constants as defaults), or None/""
            static[f.attname] = f.get_default()
    return static, dynamic, frozenset(static) | {attname for attname, _ in dynamic}


def build(model: type[M], related: dict[str, models.Model] | None = None, **values: Any) -> M:
    """A new, unsaved instance of `model` without `Model.__init__` (the engine builds ~15 per
    run; __init__'s generic keyword handling was ~8% of its CPU). `values` are keyed by attname
    (`step_id`, not `step`); `related` pre-fills the cache of relations given as objects. No
    pre_init/post_init signals are sent: none are connected for these models."""
    spec = _BUILD_SPECS.get(model)
    if spec is None:
        spec = _BUILD_SPECS[model] = _build_spec(model)
    static, dynamic, attnames = spec
    if not attnames.issuperset(values):  # no set built per call: this is the hot path
        raise TypeError(f"{model.__name__} has no fields {sorted(values.keys() - attnames)}")
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


class WriteBatch:
    """The step and attempt rows of one engine commit, written with the run update.

    Only data: the store decides how they travel (`store/postgres.py`, `store/sqlite.py`)."""

    def __init__(self) -> None:
        self.inserts: list[models.Model] = []
        self.updates: list[tuple[models.Model, list[str], dict[str, Any] | None]] = []

    def insert(self, objs: Sequence[models.Model]) -> WriteBatch:
        self.inserts.extend(objs)
        return self

    def update(
        self, obj: models.Model, fields: Sequence[str], where: dict[str, Any] | None = None
    ) -> WriteBatch:
        self.updates.append((obj, list(fields), where))
        return self


_RUN_FIELDS = Run._meta.concrete_fields
_run_converters: list[tuple[int, list[Any], Any]] | None = None


def run_columns(alias: str) -> str:
    """Every column of the run row, in the order `loaded_run` takes them, qualified by `alias`."""
    return ", ".join(f'{alias}."{f.column}"' for f in _RUN_FIELDS)


def _converters(db: Any) -> list[tuple[int, list[Any], Any]]:
    """Per column that needs one, Django's converters (JSON text -> value), as the ORM's
    compiler finds them; computed once per process."""
    global _run_converters
    if _run_converters is None:
        found = []
        for i, field in enumerate(_RUN_FIELDS):
            col = field.get_col(Run._meta.db_table)
            convs = db.ops.get_db_converters(col) + col.get_db_converters(db)
            if convs:
                found.append((i, convs, col))
        _run_converters = found
    return _run_converters


def loaded_run(values: Sequence[Any], db: Any) -> Run:
    """The Run of a row of `run_columns`, as `Run.objects.get` would build it (its SQL is
    compiled per call; a statement of our own that reads or returns the row is not)."""
    values = list(values)
    for i, convs, col in _converters(db):
        for convert in convs:
            values[i] = convert(values[i], col, db)
    return Run.from_db(DEFAULT_DB_ALIAS, None, values)
