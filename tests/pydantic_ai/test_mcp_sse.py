"""MCP over SSE (pydantic-ai's `MCPToolset` on a `/sse` URL, the `mcp` SDK's SSE server as a
real process) through a real `qcluster` whose q2 worker dies by failpoint: the happy path of
the crash matrix (a read, a mail, an idempotent call killed after the server did it) and a
server restart the run waits out. Asserted on the server's own ledger and the database."""

from __future__ import annotations

import pytest

from agentruns.models import AttemptOutcome, RunStatus, Step
from agentruns.runtime.events import EventType
from tests.crash.kit import attempt_outcomes, wait_settled
from tests.helpers import assert_gapless, events
from tests.procs import start_worker, wait_until
from tests.pydantic_ai.agents import sse_backoffice
from tests.pydantic_ai.kit import ledger, start, start_mcp

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

MAIL = {"to": "ann@example.com", "text": "Refunded"}
LATER = {"to": "bob@example.com", "text": "Shipped"}


def test_mcp_over_sse_through_the_crash_matrix_and_a_server_restart(tmp_path, procs):
    server, url, path = start_mcp(tmp_path, sse=True)
    procs.append(server)
    sse_backoffice(url)  # this process starts the runs: the same registration as the worker's
    worker = start_worker(
        tmp_path,
        name="sse-worker",
        AGENTRUNS_AGENT_MODULES="tests.pydantic_ai.agents",
        TEST_MCP_SSE_URL=url,
        AGENTRUNS_FAILPOINTS="tool_returned:sse_set_status=crash_once",
        AGENTRUNS_FAILPOINT_DIR=tmp_path / "failpoints",
        AGENTRUNS_RUNS_PER_PROCESS=1,  # the kill is that run's own
        AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS=2,  # the outage's waits: quick to notice the return
    )
    procs.append(worker)

    mail_run = start("pa-mcp-sse", ("sse_get_stock", {"sku": "LAMP"}), ("sse_send_mail", MAIL))
    status_run = start("pa-mcp-sse", ("sse_set_status", {"ticket": "T-7", "status": "closed"}))
    statuses = wait_settled([mail_run.id, status_run.id], [worker])
    assert statuses == {mail_run.id: RunStatus.SUCCEEDED, status_run.id: RunStatus.SUCCEEDED}
    book = ledger(path)
    assert book["reads"] == 1 and book["mails"] == [MAIL]
    # the idempotent tool killed after the server did it: run again, the same effect
    status = Step.objects.get(run=status_run, tool="sse_set_status")
    assert attempt_outcomes(status) == [(1, AttemptOutcome.CRASHED), (2, AttemptOutcome.SUCCEEDED)]
    assert book["statuses"] == {"T-7": "closed"} and book["status_calls"] == 2
    assert_gapless(mail_run)
    assert_gapless(status_run)

    # the server goes away: a run waits for it (no attempt used), and sends once it is back
    server.kill()
    later = start("pa-mcp-sse", ("sse_send_mail", LATER))
    wait_until(
        lambda: [
            e
            for e in events(later, EventType.STEP_RETRY_SCHEDULED)
            if e.data.get("waiting_on") == "backoffice"
        ][1:],
        timeout=120,
        message="the run waiting on its server (twice)",
    )
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    procs.append(start_mcp(tmp_path, port=port, sse=True)[0])  # the same port and ledger
    assert wait_settled([later.id], [worker]) == {later.id: RunStatus.SUCCEEDED}
    mail = Step.objects.get(run=later, tool="sse_send_mail")
    assert attempt_outcomes(mail) == [(1, AttemptOutcome.SUCCEEDED)]
    assert ledger(path)["mails"] == [MAIL, LATER]
    assert_gapless(later)
