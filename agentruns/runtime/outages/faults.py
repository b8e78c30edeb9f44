"""Which errors are weather and which are verdicts (DESIGN.md 4.10), in one place.

An *infrastructure* error says a dependency blinked: the database restarted, failed over, ran out
of pooled connections or aborted a transaction for serialization; Redis went away. It is never
the run's fault, so it never finishes a run, never counts as a step attempt and never answers
500: the slice stops without writing and the run continues when the dependency is back; the web
answers 503 with `Retry-After`.

Everything else raised inside the engine is the engine's own (a bug): the executor logs it with
the run id and ends the run as "internal error". Provider errors (the model's endpoint) have
their own classes in `runtime/providers`.

| class | why it is weather |
|---|---|
| `django.db.OperationalError`, `psycopg.OperationalError` | connection refused / terminated / lost, admin shutdown (57P01), cannot connect now (57P03), serialization failure (40001) and deadlock (40P01) (TransactionRollbackError) |
| `django.db.InterfaceError`, `psycopg.InterfaceError` | the connection object is closed (a restart dropped it under us) |
| `psycopg_pool.PoolTimeout`, `psycopg_pool.PoolClosed` | no pooled connection within its timeout (the server is down or saturated) |
| SQLSTATE class 08 (connection exception), 57P0x (operator intervention), 25006 read-only transaction (a failover's old primary), 53xxx insufficient resources | wrapped by Django as `DatabaseError`/`InternalError`: read through `__cause__` |
| `redis.exceptions.ConnectionError` / `TimeoutError` | Redis (the channel layer) went away |

Not weather: `IntegrityError`, `DataError`, `ProgrammingError` (a bug or bad data: the same
statement fails again after any outage).
"""

from __future__ import annotations

import sys

from django.db import utils as db_utils

try:  # psycopg is the PostgreSQL driver; SQLite-only installs may lack it
    import psycopg
    import psycopg_pool
except ImportError:  # pragma: no cover
    psycopg = None  # type: ignore[assignment]
    psycopg_pool = None  # type: ignore[assignment]

# SQLSTATE prefixes a server sends for faults that pass: connection exception (08), operator
# intervention (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now),
# insufficient resources (53), read-only transaction during a failover (25006), transaction
# rollback (40: serialization failure, deadlock)
_TRANSIENT_SQLSTATES = ("08", "57P0", "53", "25006", "40")


def _database_classes() -> tuple[type[BaseException], ...]:
    classes: list[type[BaseException]] = [db_utils.OperationalError, db_utils.InterfaceError]
    if psycopg is not None:
        classes += [psycopg.OperationalError, psycopg.InterfaceError]
    if psycopg_pool is not None:
        classes += [psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed]
    return tuple(classes)


DATABASE_ERRORS: tuple[type[BaseException], ...] = _database_classes()


def redis_errors() -> tuple[type[BaseException], ...]:
    """Redis's connection errors, if Redis was ever imported in this process (no Redis client
    loaded: no Redis error can exist). Not imported here: redis-py's import pulls in the
    OpenTelemetry API when it is installed, and a set-up without REDIS_URL never needs it."""
    module = sys.modules.get("redis.exceptions")
    return (module.ConnectionError, module.TimeoutError) if module is not None else ()


def _chain(exc: BaseException):
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None) or getattr(getattr(exc, "diag", None), "sqlstate", None)


def database_unavailable(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says the database is unreachable or refused the
    transaction for a reason that passes: retry later, never a verdict on the run."""
    for link in _chain(exc):
        if isinstance(link, db_utils.IntegrityError | db_utils.DataError):
            return False
        if isinstance(link, DATABASE_ERRORS):
            return True
        state = _sqlstate(link)
        if state and state.startswith(_TRANSIENT_SQLSTATES):
            return True
    return False


def redis_unavailable(exc: BaseException) -> bool:
    classes = redis_errors()
    return bool(classes) and any(isinstance(link, classes) for link in _chain(exc))


def is_infrastructure_error(exc: BaseException) -> bool:
    """Weather: a database or Redis fault. The caller stops without writing and lets the run
    continue later; it never records the error on a run or a step."""
    return database_unavailable(exc) or redis_unavailable(exc)
