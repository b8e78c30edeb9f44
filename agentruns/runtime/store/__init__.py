"""The durable store, chosen once per process by the default database's backend."""

from __future__ import annotations

from functools import cache

from django.db import connections

from agentruns.runtime.store.base import RunStore


@cache
def get_store() -> RunStore:
    # only the backend in use is imported
    if connections["default"].vendor == "postgresql":
        from agentruns.runtime.store.postgres import PostgresStore

        return PostgresStore()
    from agentruns.runtime.store.sqlite import SqliteStore

    return SqliteStore()


__all__ = ["RunStore", "get_store"]
