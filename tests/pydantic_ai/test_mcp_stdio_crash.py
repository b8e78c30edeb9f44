"""The crash matrix over an MCP server run as a real stdio process (the `mcp` SDK's server,
started by the worker for each call; tests/pydantic_ai/mcp_server.py), with a real `qcluster`
whose q2 workers die by SIGKILL: at every failpoint of DESIGN 6 (by the MCP tools' prefixed
names), and by a test's SIGKILL of the whole worker while a call is under way. Every assertion
is on the outside world: the MCP server's own ledger (one effect per step) and the database.
A non-idempotent call cut mid-call is an unknown outcome, never sent again; a person's answer
through the API continues the run."""

from __future__ import annotations

import pytest

from agentruns.models import AttemptOutcome, Run, RunEvent, RunStatus, Step, StepStatus
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from tests.crash.kit import attempt_outcomes, wait_settled
from tests.helpers import assert_gapless
from tests.procs import start_worker, wait_until
from tests.pydantic_ai.agents import stdio_backoffice
from tests.pydantic_ai.kit import ledger, start
from tests.pydantic_ai.mcp_server import set_faults

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

FAILPOINTS = ",".join(
    [
        "step_started:io_set_status=crash_once",
        "tool_returned:io_set_status=crash_once",
        "step_persisted:io_set_status=crash_once",
        "tool_returned:io_send_mail=crash_once",
        "model_streaming:pa-mcp-io=crash_once",
    ]
)
MAIL = {"to": "ann@example.com", "text": "Refunded"}
SETTLE = 300  # seconds: every call starts a Python process (the stdio server), every kill a q2 one


def _worker(tmp_path, procs, name: str, path, **env: object):
    worker = start_worker(
        tmp_path,
        name=name,
        AGENTRUNS_AGENT_MODULES="tests.pydantic_ai.agents",
        TEST_MCP_STDIO_LEDGER=path,
        AGENTRUNS_RUNS_PER_PROCESS=1,  # each kill is that run's own
        AGENTRUNS_DELTA_FLUSH_MS=5,
        AGENTRUNS_DELTA_FLUSH_CHARS=10_000,
        **env,
    )
    procs.append(worker)
    return worker


def _errors(statuses: dict) -> list:
    return list(Run.objects.filter(id__in=statuses).values_list("status", "error"))


def _reconcile_through_the_api(api, step: Step, result: dict) -> None:
    item = Approval.objects.get(step=step)
    assert (item.kind, item.status) == (ApprovalKind.RECONCILIATION, ApprovalStatus.PENDING)
    response = api.post(
        f"/api/approvals/{item.id}",
        {"decision": "happened", "result": result, "reason": "the server's log shows it sent"},
    )
    assert response.status_code == 200, response.content


def test_crash_matrix_over_a_stdio_mcp_server(tmp_path, procs, api):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))  # this process starts the runs: the same registration
    worker = _worker(
        tmp_path,
        procs,
        "pa-io-worker",
        path,
        AGENTRUNS_FAILPOINTS=FAILPOINTS,
        AGENTRUNS_FAILPOINT_DIR=tmp_path / "failpoints",
    )
    status_run = start(
        "pa-mcp-io",
        ("io_get_stock", {"sku": "LAMP"}),
        ("io_set_status", {"ticket": "T-7", "status": "closed"}),
        say="Closed the ticket, thank you for your patience.",
        word_delay=0.01,
    )
    mail_run = start("pa-mcp-io", ("io_send_mail", MAIL))
    statuses = wait_settled([status_run.id, mail_run.id], [worker], timeout=SETTLE)
    assert statuses == {
        status_run.id: RunStatus.SUCCEEDED,
        mail_run.id: RunStatus.WAITING,  # the unknown outcome waits for a person
    }, _errors(statuses)

    # the idempotent tool, killed before the call, after the server did it and after its result
    # was stored: run again only while no result was stored, with the step's one key
    status = Step.objects.get(run=status_run, tool="io_set_status")
    for point in ("step_started", "tool_returned", "step_persisted"):
        assert (tmp_path / "failpoints" / f"{point}-io_set_status-{status.id}").exists(), point
    assert attempt_outcomes(status) == [
        (1, AttemptOutcome.CRASHED),
        (2, AttemptOutcome.CRASHED),
        (3, AttemptOutcome.SUCCEEDED),
    ]
    book = ledger(path)
    assert book["statuses"] == {"T-7": "closed"}
    assert book["status_calls"] == 2  # attempts 2 and 3 called it; nothing after the result
    # the read-only tool (called in the model step's commit, so its failpoints are keyed on a
    # step id that a re-request renews: none here)
    stock = Step.objects.get(run=status_run, tool="io_get_stock")
    assert (stock.status, stock.result) == (StepStatus.SUCCEEDED, {"sku": "LAMP", "stock": 7})
    assert book["reads"] == 1
    # killed mid-stream: the dead attempt's text superseded, the final answer streamed once
    status_run.refresh_from_db()
    assert status_run.output.startswith("Closed the ticket, thank you for your patience.")
    assert RunEvent.objects.filter(run=status_run, type="model.superseded").exists()
    assert not Step.objects.filter(run=status_run).exclude(status=StepStatus.SUCCEEDED).exists()
    assert_gapless(status_run)

    # the non-idempotent tool killed after the server sent it: an unknown outcome, never resent
    mail = Step.objects.get(run=mail_run, tool="io_send_mail")
    assert mail.status == StepStatus.UNKNOWN
    assert attempt_outcomes(mail) == [(1, AttemptOutcome.UNKNOWN)]
    assert book["mails"] == [MAIL]
    _reconcile_through_the_api(api, mail, {"sent": 1})
    wait_settled([mail_run.id], [worker], timeout=SETTLE)
    assert Run.objects.get(id=mail_run.id).status == RunStatus.SUCCEEDED
    mail.refresh_from_db()
    assert (mail.status, mail.result) == (StepStatus.SUCCEEDED, {"sent": 1})
    assert ledger(path)["mails"] == [MAIL]


def test_a_worker_sigkilled_while_a_stdio_call_is_under_way(tmp_path, procs, api):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    # both calls do their effect, then hold their answer until the worker is dead
    set_faults(path, hold_in={"send_mail": 60, "set_status": 60})
    first = _worker(tmp_path, procs, "pa-io-first", path)
    mail_run = start("pa-mcp-io", ("io_send_mail", MAIL))
    status_run = start("pa-mcp-io", ("io_set_status", {"ticket": "T-8", "status": "closed"}))
    wait_until(
        lambda: (b := ledger(path)).get("mails") and b.get("status_calls"),
        timeout=180,  # a stdio server is a new Python process per call: generous on a busy box
        message="both calls under way on the server",
    )
    first.kill()  # SIGKILL, the whole worker (and the servers it started) mid-call
    assert Step.objects.get(run=mail_run, tool="io_send_mail").status == StepStatus.RUNNING
    second = _worker(tmp_path, procs, "pa-io-second", path)
    statuses = wait_settled([mail_run.id, status_run.id], [first, second], timeout=SETTLE)
    assert statuses == {
        mail_run.id: RunStatus.WAITING,
        status_run.id: RunStatus.SUCCEEDED,
    }, _errors(statuses)

    status = Step.objects.get(run=status_run, tool="io_set_status")
    assert attempt_outcomes(status) == [(1, AttemptOutcome.CRASHED), (2, AttemptOutcome.SUCCEEDED)]
    book = ledger(path)
    assert book["statuses"] == {"T-8": "closed"} and book["status_calls"] == 2

    mail = Step.objects.get(run=mail_run, tool="io_send_mail")
    assert mail.status == StepStatus.UNKNOWN
    assert attempt_outcomes(mail) == [(1, AttemptOutcome.UNKNOWN)]
    assert book["mails"] == [MAIL]
    _reconcile_through_the_api(api, mail, {"sent": 1})
    wait_settled([mail_run.id], [second], timeout=SETTLE)
    assert Run.objects.get(id=mail_run.id).status == RunStatus.SUCCEEDED
    assert ledger(path)["mails"] == [MAIL]
