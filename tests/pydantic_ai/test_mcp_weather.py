"""An MCP server that is down is weather, not a verdict (in process and as a worker does it,
PostgreSQL, the `mcp` SDK's server as a real process that the test stops and starts again):
the run waits for it with capped backoff without using the tool's attempts, says what it waits
on (the step's events and error, the run's backing-off status), resumes when the server is
back and sends the call once (the server's own ledger); cancel works meanwhile, and an outage
past AGENTRUNS_TOOL_OUTAGE_SECONDS fails the step with its reason, which retry picks up."""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepStatus
from agentruns.registry import get_tool
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.events import EventType
from agentruns.services import cancel_run
from tests.crash.kit import attempt_outcomes
from tests.helpers import advance, events
from tests.procs import wait_until
from tests.pydantic_ai.agents import backoffice
from tests.pydantic_ai.kit import ledger, start, start_mcp

pytestmark = pytest.mark.django_db(transaction=True)
MAIL = {"to": "ann@example.com", "text": "Your refund is on its way"}


@pytest.fixture
def down(tmp_path, procs, settings):
    """The back office's server, registered and then stopped: (restart(), ledger path)."""
    settings.AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS = 2  # the test's own cap: quick to notice
    settings.AGENTRUNS_SLICE_SECONDS = 300  # in process, the whole outage is one slice
    proc, url, path = start_mcp(tmp_path)
    procs.append(proc)
    backoffice(url, waive=("bo_send_mail",))
    proc.kill()
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    def restart() -> None:
        procs.append(start_mcp(tmp_path, port=port)[0])  # the same port and ledger

    return restart, path


def _retry_policy_total(tool: str) -> float:
    """The longest the tool's retry policy would keep trying (its backoffs at +jitter)."""
    policy = get_tool(tool).retry
    return sum(
        min(policy.backoff_max_seconds, policy.backoff_seconds * 2 ** (n - 1)) * (1 + policy.jitter)
        for n in range(1, policy.max_attempts)
    )


def _waits(run: Run) -> list[dict]:
    """The step's `step.retry_scheduled` events that say it waits on its server."""
    return [e.data for e in events(run, EventType.STEP_RETRY_SCHEDULED) if e.data.get("waiting_on")]


def test_an_outage_longer_than_the_retry_policy_is_waited_out_and_the_call_sent_once(down):
    restart, path = down
    outage = _retry_policy_total("bo_send_mail") + 8  # longer than the policy would have tried
    run = start("pa-mcp", ("bo_send_mail", MAIL))
    timer = threading.Timer(outage, restart)
    timer.start()
    started = time.monotonic()
    try:
        run = advance(run)  # in process: the waits sleep here
    finally:
        timer.join()
    assert time.monotonic() - started >= outage
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.SUCCEEDED)]  # no attempt used up
    assert (step.status, step.attempts, step.error) == (StepStatus.SUCCEEDED, 1, "")
    waits = _waits(run)
    assert len(waits) >= 5  # capped backoff: many tries, no hot loop (2 s cap, ~30 s outage)
    assert len(waits) < outage  # ... and never more than one a second
    assert all(w["waiting_on"] == "backoffice" and w["attempts"] == 0 for w in waits)
    assert "waiting on backoffice" in waits[-1]["reason"] and "unreachable" in waits[-1]["reason"]
    assert ledger(path)["mails"] == [MAIL]  # sent once, when the server was back


def test_a_worker_gives_the_thread_back_while_it_waits_and_the_page_says_on_what(down, api):
    restart, path = down
    run = start("pa-mcp", ("bo_send_mail", MAIL))
    # as a worker runs it: a wait longer than AGENTRUNS_RETRY_SLEEP_MAX_SECONDS frees the slot
    status = RunExecutor(run.id, drain=threading.Event()).advance()
    assert status == RunStatus.QUEUED
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.lease_owner in ("", None)
    backoff = events(run, EventType.RUN_STATUS)[-1].data
    assert backoff["status"] == RunStatus.QUEUED
    assert backoff["reason"].startswith("waiting on backoffice (")
    assert backoff["tool_outage"]["failures"] >= 2
    shown = api.get(f"/api/runs/{run.id}").json()
    (mail,) = [s for s in shown["steps"] if s["tool"] == "bo_send_mail"]
    assert mail["status"] == StepStatus.PENDING and mail["attempts"] == 0
    assert mail["error"].startswith("waiting on backoffice")
    api.client.force_login(api.user)
    page = api.client.get(f"/runs/{run.id}/").content.decode()
    assert "Backing off" in page and "waiting on backoffice" in page

    # the next slice continues the same outage (its backoff and its budget) ...
    run = _slice_when_due(run)
    assert run.status == RunStatus.QUEUED
    again = events(run, EventType.RUN_STATUS)[-1].data["tool_outage"]
    assert again["since"] == backoff["tool_outage"]["since"]
    assert again["failures"] > backoff["tool_outage"]["failures"]
    assert ledger(path) == {}
    restart()
    while run.status == RunStatus.QUEUED:  # ... and the one after the server is back sends it
        run = _slice_when_due(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.SUCCEEDED)]
    assert ledger(path)["mails"] == [MAIL]


def _slice_when_due(run: Run) -> Run:
    """One worker slice of the queued run once its doorbell is due."""
    time.sleep(max(0.0, (run.enqueued_at - timezone.now()).total_seconds()))
    RunExecutor(run.id, drain=threading.Event()).advance()
    run.refresh_from_db()
    return run


def test_a_run_waiting_on_its_server_can_be_cancelled(down):
    restart, path = down
    run = start("pa-mcp", ("bo_send_mail", MAIL))

    def work() -> None:
        try:
            advance(run)
        finally:
            connection.close()  # this thread's own

    worker = threading.Thread(target=work)
    worker.start()
    wait_until(lambda: _waits(run), timeout=60, message="the run waiting on its server")
    cancel_run(run.id, reason="not needed")
    worker.join(timeout=30)
    assert not worker.is_alive()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED, run.error
    restart()
    assert ledger(path) == {}  # never sent


def test_an_outage_past_its_budget_fails_with_the_reason_and_retry_sends_it_once(
    down, settings, api
):
    restart, path = down
    settings.AGENTRUNS_TOOL_OUTAGE_SECONDS = 3
    run = advance(start("pa-mcp", ("bo_send_mail", MAIL)))
    assert run.status == RunStatus.FAILED
    # the outage lasted at least the budget (under load the verdict may come a second later)
    waited = re.search(r"backoffice was unavailable for (\d+) s", run.error)
    assert waited is not None and int(waited.group(1)) >= 3, run.error
    assert "AGENTRUNS_TOOL_OUTAGE_SECONDS=3" in run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.FAILED)]  # the verdict's one attempt
    restart()
    response = api.post(f"/api/runs/{run.id}/retry", {})
    assert response.status_code in (200, 202), response.content
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ledger(path)["mails"] == [MAIL]
