"""Database connections of a process that keeps many runs in flight.

With PostgreSQL every process has a psycopg pool (config/settings.py, Django's native pool):
Django "closing" a thread's connection returns it to the pool. A run's thread gives its
connection back before it waits on the world (a model stream, a tool's HTTP call, a backoff),
so a process needs as many connections as runs *talking to the database at once*, not as many
as runs in flight. SQLite has no pool (a connection is a file handle): nothing to release.

Pools and fork: django-q2 forks its worker processes from processes that have used the
database. A pool inherited by a child holds the parent's sockets; using one from both sides
corrupts the protocol, and closing one in the child would end the parent's sessions. So a forked
child forgets the inherited pools without touching them (`forget_inherited_pools`, registered at
start-up) and opens its own on first use.

Outages: psycopg_pool's reconnection backoff is capped (`cap_reconnect_backoff`), so the pool
has its connections back within a second or so of the database's return, and a reconnect series
it gives up (after DB_POOL_RECONNECT_SECONDS) is started afresh while a thread still waits for a
connection (`regrow_for_waiting_clients`).
"""

from __future__ import annotations

import logging
import os
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from agentruns.backoff import jittered
from agentruns.runtime.outages import weather

# the inherited pools and connections a forked child must never use, close or collect
_inherited: list[Any] = []


@cache
def pooled() -> bool:
    return bool(connections[DEFAULT_DB_ALIAS].settings_dict.get("OPTIONS", {}).get("pool"))


def release() -> None:
    """Give this thread's connection back to the pool (no-op outside a pool or a transaction)."""
    if not pooled():
        return
    db = connections[DEFAULT_DB_ALIAS]
    if db.connection is not None and not db.in_atomic_block:
        db.close()


def pool_size() -> int:
    """Connections this process's pool holds open (lent out or idle); 0 without a pool."""
    if not pooled():
        return 0
    pool = connections[DEFAULT_DB_ALIAS].pool
    return int(pool.get_stats().get("pool_size", 0)) if pool is not None else 0


def forget_inherited_pools() -> None:
    """In a forked child: drop the parent's pools and connection objects, keeping them
    referenced so they are never closed or garbage-collected (both would talk on shared sockets)."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited.append(dict(DatabaseWrapper._connection_pools))
    DatabaseWrapper._connection_pools.clear()
    for db in connections.all(initialized_only=True):
        if db.connection is not None:
            _inherited.append(db.connection)
            db.connection = None


def guard_forks() -> None:
    """Called once at start-up (apps.ready) when PostgreSQL is pooled."""
    if pooled():
        os.register_at_fork(after_in_child=forget_inherited_pools)
        cap_reconnect_backoff()
        regrow_for_waiting_clients()


# psycopg_pool retries a failed connection 1, 2, 4, 8, 16 ... s apart without a cap: after an 8 s
# outage its next try came 7 s after the database was back, and a getconn() waiting meanwhile hit
# its 30 s timeout ("couldn't get a connection after 30.00 sec"). Capped, a process has its
# connections back within about this long of the database's return.
RECONNECT_BACKOFF_CAP_SECONDS = 1.0


def cap_reconnect_backoff(cap: float = RECONNECT_BACKOFF_CAP_SECONDS) -> None:
    """Make psycopg_pool's reconnection backoff (1 s, doubling, +-10 %) stop growing at `cap`."""
    from psycopg_pool import base
    from psycopg_pool import pool as sync_pool

    if getattr(sync_pool.AttemptWithBackoff, "capped_at", None) is not None:
        return

    class CappedBackoff(base.AttemptWithBackoff):
        capped_at = cap

        def update_delay(self, now: float) -> None:
            super().update_delay(now)
            # 80% to 100% of the cap, at random, so reconnects do not come in step
            self.delay = min(self.delay, jittered(self.capped_at * 0.9, 1 / 9))

    sync_pool.AttemptWithBackoff = CappedBackoff
    logging.getLogger("psycopg.pool").addFilter(_quiet_reconnects)


def regrow_for_waiting_clients() -> None:
    """When psycopg_pool gives up a reconnect series it lowers its connection count and waits
    for the *next* getconn() to start another: a thread already waiting then got nothing until
    its own timeout (measured: an outage of 5 s, reconnect_timeout 2 s, the waiting thread's
    PoolTimeout after the full 30 s with the database back since 25 s; pool_size 0). Patched,
    a series given up while a client still waits is followed at once by a fresh one."""
    from psycopg_pool import ConnectionPool

    if getattr(ConnectionPool.reconnect_failed, "regrows", False):
        return
    original = ConnectionPool.reconnect_failed

    def reconnect_failed(pool: ConnectionPool) -> None:
        original(pool)  # the pool's own `reconnect_failed` callback, if one was configured
        with pool._lock:
            # a timed-out client stays queued (with its error) until a connection comes
            if not pool.closed and any(not (w.conn or w.error) for w in pool._waiting):
                pool._maybe_grow_pool()  # no-op while another growing series is under way

    reconnect_failed.regrows = True  # type: ignore[attr-defined]
    ConnectionPool.reconnect_failed = reconnect_failed  # type: ignore[method-assign]


def _quiet_reconnects(record: logging.LogRecord) -> bool:
    """psycopg_pool warns at every failed reconnection (now every second) and every dead
    connection it discards after a restart: the outage is logged once by `weather.py` instead
    (a failed reconnection is how a process whose threads only wait for a connection notices)."""
    message = str(record.msg)
    if message.startswith("error connecting in"):
        weather.database.noticed(ConnectionError(record.getMessage()), "the connection pool")
        return False
    return not message.startswith("discarding closed connection")


def open_listener(channel: str, alias: str = DEFAULT_DB_ALIAS) -> Any:
    """A connection of its own, outside the pool and autocommit, LISTENing on `channel`
    (PostgreSQL only): the doorbell broker's and each worker's claimer."""
    import psycopg  # the PostgreSQL driver, only on PostgreSQL

    params = connections[alias].get_connection_params()
    for pooled_only in ("pool", "cursor_factory", "context"):
        params.pop(pooled_only, None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn


def close_listener(conn: Any) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:  # a listener the server dropped: nothing left to close
            pass
