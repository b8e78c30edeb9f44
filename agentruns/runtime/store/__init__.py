"""The durable store, chosen once per process by the default database's backend."""

from __future__ import annotations

from functools import cache

from agentruns.runtime.store.base import RunStore


@cache
def get_store() -> RunStore:
    from django.db import connections

    if connections["default"].vendor == "postgresql":
        from agentruns.runtime.store.postgres import PostgresStore

        return PostgresStore()
    from agentruns.runtime.store.sqlite import SqliteStore

    return SqliteStore()


__all__ = ["RunStore", "get_store"]
