"""Lean writes for the engine's hot path.

`insert_sql` replaces `bulk_create` (which spends milliseconds per call on bookkeeping the engine
does not need: it knows its primary keys, needs no returned ids, never conflicts).

`WriteBatch` sends a whole engine commit to PostgreSQL as ONE multi-statement query: PostgreSQL
runs a multi-statement simple query as one implicit transaction, so a commit costs one round trip
instead of BEGIN + one per statement + COMMIT. Django's psycopg cursor binds parameters on the
client, which is what allows several statements in one call. Elsewhere (SQLite) the statements
run one by one inside `transaction.atomic()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models


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
    def __init__(self) -> None:
        self.statements: list[tuple[str, list[Any]]] = []

    def insert(self, objs: Sequence[models.Model]) -> WriteBatch:
        if objs:
            self.statements.append(insert_sql(objs))
        return self

    def update(self, obj: models.Model, fields: Sequence[str], where: dict[str, Any] | None = None) -> WriteBatch:
        self.statements.append(update_sql(obj, fields, where))
        return self

    @property
    def one_round_trip(self) -> bool:
        # outside a transaction PostgreSQL runs the statements as one implicit transaction;
        # inside one (a transactional tool's step) they simply join it
        return connection.vendor == "postgresql"

    def run(self, last: tuple[str, list[Any]], guard: tuple[str, list[Any]] | None = None) -> list[tuple]:
        """PostgreSQL: `guard`, the batch, then `last`, in one round trip and one transaction (an
        implicit one, or the caller's); returns `last`'s rows. `guard` must raise (aborting
        everything) when the writes are no longer allowed."""
        statements = ([guard] if guard else []) + self.statements + [last]
        sql = ";\n".join(s for s, _ in statements)
        params = [p for _, ps in statements for p in ps]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            while cursor.nextset():
                pass
            return cursor.fetchall()

    def execute_each(self) -> None:
        """Anywhere else: one statement at a time (the caller holds the transaction)."""
        with connection.cursor() as cursor:
            for sql, params in self.statements:
                cursor.execute(sql, params)


def insert_rows(objs: Sequence[models.Model]) -> None:
    if objs:
        sql, params = insert_sql(objs)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
