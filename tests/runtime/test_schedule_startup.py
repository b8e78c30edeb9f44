"""Workers starting together (runtime/workers/sweeper.ensure_schedule): any number of them leave
exactly one sweeper schedule row; duplicates an older version left are repaired, and a worker
finding them starts (it once exited with MultipleObjectsReturned, at every restart)."""

from __future__ import annotations

import socket
import time
import uuid

import psycopg
import pytest
from django.db import connection
from django_q.models import Schedule

from agentruns.models import WorkerHeartbeat
from agentruns.runtime.workers.sweeper import SWEEP_SCHEDULE_NAME, SWEEP_TASK, ensure_schedule
from tests import procs
from tests.helpers import race
from tests.procs import base_env, manage, sqlite_env, start_worker, wait_until
from tests.sqlite_templates import migrated_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

STARTERS = 8


def _rows() -> list[Schedule]:
    return list(Schedule.objects.filter(name=SWEEP_SCHEDULE_NAME))


def test_workers_starting_together_leave_one_schedule_row():
    """8 starts behind a barrier, each on its own connection, 10 times from an empty table
    (the old update_or_create: duplicates in 7 of 10 tries with only two)."""
    for attempt in range(10):
        Schedule.objects.all().delete()
        answers = race(*[ensure_schedule] * STARTERS)
        assert [a for a in answers if a is not None] == [], (attempt, answers)
        rows = _rows()
        assert len(rows) == 1, (attempt, len(rows))
        assert rows[0].func == SWEEP_TASK and rows[0].schedule_type == Schedule.MINUTES


def test_duplicates_left_behind_are_repaired():
    for _ in range(3):
        Schedule.objects.create(name=SWEEP_SCHEDULE_NAME, func="old.path", minutes=5)
    first = min(s.id for s in _rows())
    ensure_schedule()
    (row,) = _rows()
    assert row.id == first  # the oldest is kept (its next run stands), brought up to date
    assert (row.func, row.minutes, row.repeats) == (SWEEP_TASK, 1, -1)


def test_a_worker_starts_on_a_database_with_duplicate_schedules(tmp_path):
    """The real qcluster: two rows as two racing workers of an older version left them."""
    for _ in range(2):
        Schedule.objects.create(
            name=SWEEP_SCHEDULE_NAME, func=SWEEP_TASK, schedule_type=Schedule.MINUTES, minutes=1
        )
    worker = start_worker(tmp_path)
    try:
        wait_until(
            lambda: (
                not worker.alive
                or WorkerHeartbeat.objects.filter(
                    worker=f"qcluster@{socket.gethostname()}:{worker.popen.pid}"
                ).exists()
            ),
            timeout=60,
            message="the worker to start",
        )
        assert worker.alive, worker.log()
        assert len(_rows()) == 1
    finally:
        worker.kill()


RACE_ON_SQLITE = """
import threading
from django.db import connection
from django_q.models import Schedule
from agentruns.runtime.workers.sweeper import SWEEP_SCHEDULE_NAME, ensure_schedule
counts = []
for _ in range(5):
    Schedule.objects.all().delete()
    barrier, errors = threading.Barrier(6), []
    def start():
        barrier.wait()
        try:
            ensure_schedule()
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connection.close()
    threads = [threading.Thread(target=start) for _ in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    counts.append((Schedule.objects.filter(name=SWEEP_SCHEDULE_NAME).count(), errors))
print(counts)
"""


def test_workers_starting_together_on_sqlite_leave_one_row(tmp_path):
    env = base_env(**sqlite_env(tmp_path / "db.sqlite3", "http://127.0.0.1:1"))
    migrated_sqlite(tmp_path / "db.sqlite3")
    out = manage(env, "shell", "-c", RACE_ON_SQLITE).strip().splitlines()[-1]
    assert out == str([(1, [])] * 5), out


def test_a_worker_started_before_migrate_waits_for_it(tmp_path):
    """A deploy that starts its workers while `migrate` still runs: the worker waits (it exited
    with ProgrammingError, 'relation does not exist') and starts once the tables are there."""
    name = f"unmigrated_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    url = procs.test_database_url().rsplit("/", 1)[0] + "/" + name
    env = base_env(DATABASE_URL=url)
    worker = start_worker(tmp_path, DATABASE_URL=url)
    try:
        wait_until(lambda: "waiting for `manage.py migrate`" in worker.log() or not worker.alive)
        time.sleep(1)
        assert worker.alive, worker.log()
        manage(env, "migrate", "--noinput", "-v0")
        beat = f"qcluster@{socket.gethostname()}:{worker.popen.pid}"

        def started() -> bool:
            with psycopg.connect(url) as conn:
                found = conn.execute(
                    "SELECT 1 FROM agentruns_workerheartbeat WHERE worker = %s", [beat]
                ).fetchone()
            return found is not None or not worker.alive

        wait_until(started, timeout=60, interval=0.5, message="the worker to start")
        assert worker.alive, worker.log()
    finally:
        worker.kill()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")
