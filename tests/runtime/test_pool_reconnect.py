"""The process's psycopg pool after it gave up a reconnect series (DB_POOL_RECONNECT_SECONDS):
a thread that was waiting for a connection meanwhile gets one once the database is back, not a
PoolTimeout at the end of its wait (psycopg_pool alone starts a new series only on the *next*
request; `connections.regrow_for_waiting_clients`)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from agentruns.models import Run
from tests.helpers import script_run
from tests.runtime.dbfaults import allow_connections, refuse_connections, short_pool_timeout

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_SECONDS = 20.0  # the waiting read's pool timeout: far past the outage below


def test_a_read_waiting_while_the_pool_gives_up_reconnecting_gets_its_row(caplog):
    run = script_run([{"text": "done"}])
    give_up_after = connection.pool.reconnect_timeout
    result: dict[str, object] = {}

    def read() -> None:
        try:
            result["row"] = Run.objects.get(id=run.id)
        except Exception as exc:  # what the test reports
            result["error"] = exc
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    with short_pool_timeout(WAIT_SECONDS), caplog.at_level("WARNING", logger="psycopg.pool"):
        refuse_connections()
        try:
            reader.start()
            time.sleep(give_up_after + 2)  # the pool gives up its series while the read waits
        finally:
            allow_connections()
        reader.join(WAIT_SECONDS + 10)
    assert any("reconnection attempt" in r.getMessage() for r in caplog.records)  # it gave up
    assert "error" not in result, result["error"]
    assert result["row"].id == run.id
