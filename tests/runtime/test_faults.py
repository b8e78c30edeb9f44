"""Which errors are weather (runtime/outages/faults.py): one test per class in its table, with the
errors a real PostgreSQL, a real pool and a real Redis client raise wherever one can be made."""

from __future__ import annotations

import socket
import threading

import psycopg
import psycopg_pool
import pytest
import redis
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InternalError,
    ProgrammingError,
    connection,
    transaction,
)
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError

from agentruns.models import Run
from agentruns.runtime.outages.faults import (
    database_unavailable,
    is_infrastructure_error,
    redis_unavailable,
)
from agentruns.runtime.outages.weather import Backoff, Outage, outage_of
from tests.runtime.dbfaults import _admin


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wrapped(django_class: type[DatabaseError], cause: BaseException) -> DatabaseError:
    """As Django raises a driver error: its own class, the driver's error as the cause."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise django_class(str(exc)) from exc
    except django_class as wrapped:
        return wrapped


# ------------------------------------------------------------------ weather
def test_connection_refused_is_weather():
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(host="127.0.0.1", port=_closed_port(), user="x", connect_timeout=2)
    assert database_unavailable(caught.value) and is_infrastructure_error(caught.value)
    assert database_unavailable(_wrapped(DjangoOperationalError, caught.value))


@pytest.mark.django_db(transaction=True)
def test_terminated_session_is_weather():
    """pg_terminate_backend: "terminating connection due to administrator command" (57P01), as
    Django raises it, and the next use of that connection (closed: InterfaceError or
    OperationalError)."""
    with pytest.raises(DatabaseError) as caught:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    assert database_unavailable(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    with pytest.raises(DatabaseError) as again:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    assert database_unavailable(again.value)
    connection.close()


def test_closed_connection_is_weather():
    """A connection a restart closed under us (psycopg 3 says OperationalError "the connection is
    closed"; the InterfaceError classes are what older drivers and Django's wrapper raise)."""
    with _admin() as admin:
        pass
    with pytest.raises(psycopg.Error) as caught:
        admin.execute("SELECT 1")
    assert database_unavailable(caught.value)
    for error in (
        psycopg.InterfaceError("connection already closed"),
        _wrapped(DjangoInterfaceError, psycopg.InterfaceError("connection already closed")),
    ):
        assert database_unavailable(error)


def test_pool_timeout_and_closed_pool_are_weather():
    pool = psycopg_pool.ConnectionPool(
        f"host=127.0.0.1 port={_closed_port()} user=x connect_timeout=1",
        min_size=0,
        max_size=1,
        open=True,
        timeout=0.3,
        reconnect_timeout=1,
    )
    try:
        with pytest.raises(psycopg_pool.PoolTimeout) as caught:
            pool.getconn()
    finally:
        pool.close()
    assert database_unavailable(caught.value)
    with pytest.raises(psycopg_pool.PoolClosed) as closed:
        pool.getconn()
    assert database_unavailable(closed.value)


@pytest.mark.django_db(transaction=True)
def test_read_only_transaction_of_a_failed_over_primary_is_weather():
    """25006 comes as Django's InternalError: weather only by its SQLSTATE."""
    with pytest.raises(InternalError) as caught:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            Run.objects.create(agent="script", input={})
    assert caught.value.__cause__.sqlstate == "25006"
    assert database_unavailable(caught.value)


@pytest.mark.django_db(transaction=True)
def test_serialization_failure_is_weather():
    """40001 from two real serializable transactions writing what the other read."""
    run = Run.objects.create(agent="script", input={})
    s = connection.settings_dict
    dsn = dict(host=s["HOST"] or "127.0.0.1", port=s["PORT"], user=s["USER"], dbname=s["NAME"])
    first, second = psycopg.connect(**dsn), psycopg.connect(**dsn)
    table = Run._meta.db_table
    try:
        for conn in (first, second):
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            conn.execute(f"SELECT step_count FROM {table} WHERE id = %s", [run.id])
        first.execute(f"UPDATE {table} SET step_count = 1 WHERE id = %s", [run.id])
        first.commit()
        with pytest.raises(psycopg.errors.SerializationFailure) as caught:
            second.execute(f"UPDATE {table} SET step_count = 2 WHERE id = %s", [run.id])
    finally:
        first.close()
        second.close()
    assert database_unavailable(caught.value)
    assert database_unavailable(_wrapped(DjangoOperationalError, caught.value))


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CrashShutdown("crash shutdown"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.TooManyConnections("too many clients already"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.ConnectionFailure("connection failure"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_server_states_that_pass_are_weather(error):
    """The SQLSTATE classes of the table (08, 57P0x, 53, 40), also when Django wraps them in a
    class that is not weather by itself."""
    assert database_unavailable(error)
    assert database_unavailable(_wrapped(DatabaseError, error))


def test_redis_going_away_is_weather():
    client = redis.Redis(host="127.0.0.1", port=_closed_port(), socket_connect_timeout=1)
    with pytest.raises(redis.exceptions.ConnectionError) as caught:
        client.ping()
    assert redis_unavailable(caught.value) and is_infrastructure_error(caught.value)
    assert not database_unavailable(caught.value)
    assert outage_of(caught.value).dependency == "redis"
    assert redis_unavailable(redis.exceptions.TimeoutError("Timeout reading from socket"))


# ------------------------------------------------------------------ verdicts
@pytest.mark.django_db(transaction=True)
def test_integrity_data_and_programming_errors_are_verdicts():
    run = Run.objects.create(agent="script", input={})
    errors = []
    for statement, params in [
        (f"INSERT INTO {Run._meta.db_table} (id) VALUES (%s)", [run.id]),  # IntegrityError
        ("SELECT 'x'::integer", []),  # DataError
        ("SELECT * FROM no_such_table", []),  # ProgrammingError
    ]:
        with pytest.raises((IntegrityError, DataError, ProgrammingError)) as caught:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(statement, params)
        errors.append(caught.value)
    assert [type(e) for e in errors] == [IntegrityError, DataError, ProgrammingError]
    assert not any(is_infrastructure_error(e) for e in errors)


def test_engine_errors_are_verdicts():
    for error in (ValueError("bad"), KeyError("x"), RuntimeError("bug"), TypeError("t")):
        assert not is_infrastructure_error(error)


def test_an_integrity_error_caused_by_nothing_transient_stays_a_verdict():
    """The chain is read through: a verdict wrapped around weather is weather, and the other way
    round a verdict stays one."""
    verdict = _wrapped(IntegrityError, psycopg.errors.UniqueViolation("duplicate key"))
    assert not database_unavailable(verdict)


# ------------------------------------------------------------------ riding it out
def test_backoff_is_capped_exponential_with_jitter():
    backoff = Backoff(base=0.1, cap=1.0, jitter=0.25)
    delays = [backoff.next() for _ in range(8)]
    assert 0.075 <= delays[0] <= 0.125
    assert all(0.75 <= d <= 1.25 for d in delays[4:])  # capped
    assert delays[1] > delays[0] * 1.1  # growing before the cap
    backoff.reset()
    assert backoff.next() <= 0.125


def test_an_outage_logs_once_when_it_starts_and_once_when_it_ends(caplog):
    outage = Outage("database")
    error = psycopg.errors.AdminShutdown("terminating connection")

    def hit() -> None:
        for _ in range(50):
            outage.noticed(error, "a thread")

    threads = [threading.Thread(target=hit) for _ in range(8)]
    with caplog.at_level("WARNING", logger="agentruns.runtime.outages.weather"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outage.is_down
        length = outage.passed()
        assert outage.passed() is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database unavailable") and "AdminShutdown" in lines[0]
    assert lines[1] == f"database is back after {length:.1f}s"
