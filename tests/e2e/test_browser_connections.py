"""The connections a browser test used are given back when its browser closes (the `browser`
fixture): none stays checked out of the pool for the rest of the process, where a later
`asyncio.run()` on the same thread would inherit it, dead if the database restarted meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from django.db import DatabaseError, connection, connections

from agentruns.models import Run
from tests.e2e.conftest import chromium_browser
from tests.procs import wait_until
from tests.runtime.dbfaults import allow_connections, refuse_connections

pytestmark = pytest.mark.django_db(transaction=True)


def _checked_out_in_a_running_loop():
    """The connection a coroutine on this thread would be given without asking the pool."""

    async def main():
        return connections["default"].connection

    return asyncio.run(main())


def _answers_again() -> bool:
    """This thread's own (sync) connection works again: the pool may still be in its reconnect
    backoff right after the outage, which is not what the test below is about."""
    try:
        Run.objects.exists()
        return True
    except DatabaseError:
        return False
    finally:
        connection.close()


def test_a_browser_tests_connection_goes_back_when_its_browser_closes():
    with chromium_browser():
        Run.objects.count()  # the test's own query, while Playwright's loop runs on this thread
    assert _checked_out_in_a_running_loop() is None


def test_a_run_advanced_from_a_running_loop_after_a_browser_test_and_an_outage_starts():
    """The suite's order that failed once in CI: a browser test, then an outage, then a run
    advanced from a running loop (tests/providers/test_stream_pump.py)."""
    with chromium_browser():
        Run.objects.count()
    refuse_connections()
    allow_connections()
    wait_until(_answers_again, timeout=60, message="the pool to connect again after the outage")

    async def main():
        try:
            return Run.objects.count()
        finally:
            connections.close_all()

    assert asyncio.run(main()) == 0
