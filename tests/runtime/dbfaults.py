"""Real database faults for in-process engine tests: the test's own database stops taking
connections and every session on it is terminated, as when PostgreSQL restarts or fails over.

`database_refusing()` uses PostgreSQL itself (`ALTER DATABASE ... ALLOW_CONNECTIONS false` plus
`pg_terminate_backend`, from a connection to another database), so what the engine sees is what
it sees in production: a terminated session, then a pool that cannot connect (`PoolTimeout`,
after the pool's timeout, shortened here to keep the test quick). Only this test process's own
database is touched (xdist gives every process one of its own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import connection

POOL_TIMEOUT_SECONDS = 1.0


def _admin() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )


def refuse_connections() -> None:
    """New connections are refused, and every session is terminated (this thread's own gives
    its connection back first, so its next query connects afresh)."""
    name = connection.settings_dict["NAME"]
    if not connection.in_atomic_block:
        connection.close()
    with _admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            [name],
        )


def allow_connections() -> None:
    """Connections are taken again; this thread's own, which the outage may have terminated
    under it (refused from another thread), is given back so its next query connects afresh:
    a terminated connection left in a test's thread would fail every later test of the process
    ("the connection is closed": nothing between tests closes it, as a request's end would)."""
    name = connection.settings_dict["NAME"]
    with _admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    if not connection.in_atomic_block:
        connection.close()


@contextlib.contextmanager
def short_pool_timeout(seconds: float = POOL_TIMEOUT_SECONDS) -> Iterator[None]:
    """The process's pool gives up on a connection after `seconds` (production: 30)."""
    pool = connection.pool
    if pool is None:
        yield
        return
    saved, pool.timeout = pool.timeout, seconds
    try:
        yield
    finally:
        pool.timeout = saved


@contextlib.contextmanager
def database_refusing() -> Iterator[None]:
    """The database is unreachable inside the block (and for the code it calls)."""
    refuse_connections()
    try:
        yield
    finally:
        allow_connections()
