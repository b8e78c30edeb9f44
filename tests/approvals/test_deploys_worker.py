"""A deploy without a run's agent module (issue 19 item 6), with real worker processes: a worker
started without AGENTRUNS_AGENT_MODULES leaves the run waiting with the reason (never failed);
the next worker, started with the module, continues it."""

from __future__ import annotations

import time

import pytest

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from tests.procs import start_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENV = {"AGENTRUNS_AGENT_MISSING_RETRY_SECONDS": 0.5}


def test_a_run_waits_for_its_missing_agent_module_and_continues_when_it_is_back(tmp_path):
    without = start_worker(tmp_path, name="without-module", AGENTRUNS_AGENT_MODULES="", **ENV)
    try:
        run = start_run("script", {"script": [{"text": "hello after the deploy"}]}).run
        waiting = wait_until(
            lambda: (r := Run.objects.get(id=run.id)).error and r,
            timeout=90,
            message="the worker to find the agent missing",
        )
        assert "unknown agent 'script'" in waiting.error and "waits" in waiting.error
        time.sleep(3)  # several more looks (every 0.5 s): still waiting, never a verdict
        still = Run.objects.get(id=run.id)
        assert still.status in (RunStatus.QUEUED, RunStatus.RUNNING), still.error
        assert still.finished_at is None and still.step_count == 0
    finally:
        without.stop()
    back = start_worker(
        tmp_path, name="with-module", AGENTRUNS_AGENT_MODULES="tests.testkit", **ENV
    )
    try:
        done = wait_until(
            lambda: (r := Run.objects.get(id=run.id)).is_terminal and r,
            timeout=90,
            message="the run to continue once its agent is back",
        )
        assert done.status == RunStatus.SUCCEEDED and done.output == "hello after the deploy"
        assert done.error == ""
    finally:
        back.stop()
