"""The crash matrix on Pydantic AI agents, with real processes: a real `qcluster` whose q2
workers die by failpoint (SIGKILL at the named point), a real daphne serving the refund gateway,
and the `mcp` SDK's server as a real process. Every assertion is on the outside world: the
gateway's ledger, the MCP server's own ledger, the database rows.

One run of `pa-shop` goes through every failpoint of its side-effect function tool in turn
(killed before the call, after it returned, after its result was stored) and is killed once
mid-stream; MCP runs show an idempotent tool re-run after a kill mid-call, and a
non-idempotent one killed mid-call landing in reconciliation, never sent twice.
"""

from __future__ import annotations

import pytest

from agentruns.models import AttemptOutcome, Run, RunEvent, RunStatus, Step, StepStatus
from approvals import services
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from support.models import GatewayRefund
from tests.crash.kit import attempt_outcomes, wait_settled
from tests.helpers import assert_gapless
from tests.procs import gateway_refunds, start_web, start_worker
from tests.pydantic_ai.agents import backoffice
from tests.pydantic_ai.kit import ledger, start, start_mcp

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

WAIVED = ("bo_set_status", "bo_send_mail")  # as the workers register them (agents.py)
FAILPOINTS = ",".join(
    [
        "step_started:pa_refund=crash_once",
        "tool_returned:pa_refund=crash_once",
        "step_persisted:pa_refund=crash_once",
        "model_streaming:pa-shop=crash_once",
        "tool_returned:bo_set_status=crash_once",
        "tool_returned:bo_send_mail=crash_once",
    ]
)


@pytest.fixture
def world(tmp_path, procs, seeded):
    web, gateway = start_web(tmp_path)
    procs.append(web)
    mcp, url, path = start_mcp(tmp_path)
    procs.append(mcp)
    backoffice(url, waive=WAIVED)  # this process starts the runs: the same registration
    worker = start_worker(
        tmp_path,
        name="pa-worker",
        AGENTRUNS_AGENT_MODULES="tests.pydantic_ai.agents",
        TEST_MCP_URL=url,
        REFUND_GATEWAY_URL=gateway + "/gateway",
        AGENTRUNS_FAILPOINTS=FAILPOINTS,
        AGENTRUNS_FAILPOINT_DIR=tmp_path / "failpoints",
        AGENTRUNS_RUNS_PER_PROCESS=1,  # each kill is that run's own
        AGENTRUNS_DELTA_FLUSH_MS=5,
        AGENTRUNS_DELTA_FLUSH_CHARS=10_000,
    )
    procs.append(worker)
    return {
        "gateway": gateway,
        "ledger": path,
        "worker": worker,
        "failpoints": tmp_path / "failpoints",
    }


def test_crash_matrix_on_pydantic_ai_function_and_mcp_tools(world, django_user_model):
    refund_run = start(
        "pa-shop",
        ("pa_refund", {"order_id": "ORD-1001", "amount_cents": 2500}),
        say="Refunded as asked, thank you for your patience.",
        word_delay=0.01,
    )
    status_run = start("pa-mcp", ("bo_set_status", {"ticket": "T-7", "status": "closed"}))
    mail_run = start("pa-mcp", ("bo_send_mail", {"to": "ann@example.com", "text": "Refunded"}))
    statuses = wait_settled([refund_run.id, status_run.id, mail_run.id], [world["worker"]])
    assert statuses == {
        refund_run.id: RunStatus.SUCCEEDED,
        status_run.id: RunStatus.SUCCEEDED,
        mail_run.id: RunStatus.WAITING,  # the unknown outcome waits for a person
    }

    # the function tool: killed before the call, after it, after its result: one refund, made
    # with the step's one idempotency key; the completed call was never made again
    refund = Step.objects.get(run=refund_run, tool="pa_refund")
    rows = list(GatewayRefund.objects.filter(order_id="ORD-1001"))
    assert [(r.amount_cents, r.idempotency_key) for r in rows] == [(2500, refund.idempotency_key)]
    assert [r["idempotency_key"] for r in gateway_refunds(world["gateway"], "ORD-1001")] == [
        refund.idempotency_key
    ]
    for point in ("step_started", "tool_returned", "step_persisted"):
        assert (world["failpoints"] / f"{point}-pa_refund-{refund.id}").exists(), point
    assert attempt_outcomes(refund) == [
        (1, AttemptOutcome.CRASHED),
        (2, AttemptOutcome.CRASHED),
        (3, AttemptOutcome.SUCCEEDED),
    ]
    assert refund.result["amount_cents"] == 2500
    # killed mid-stream: the dead attempt's text superseded, the final answer streamed once
    refund_run.refresh_from_db()
    assert refund_run.output.startswith("Refunded as asked, thank you for your patience.")
    assert RunEvent.objects.filter(run=refund_run, type="model.superseded").exists()
    assert not Step.objects.filter(run=refund_run).exclude(status=StepStatus.SUCCEEDED).exists()
    assert_gapless(refund_run)

    # the idempotent MCP tool killed after the server did it: run again, same effect
    status = Step.objects.get(run=status_run, tool="bo_set_status")
    assert status.status == StepStatus.SUCCEEDED
    assert attempt_outcomes(status) == [(1, AttemptOutcome.CRASHED), (2, AttemptOutcome.SUCCEEDED)]
    book = ledger(world["ledger"])
    assert book["statuses"] == {"T-7": "closed"} and book["status_calls"] == 2

    # the non-idempotent MCP tool killed mid-call: an unknown outcome, never sent again
    mail = Step.objects.get(run=mail_run, tool="bo_send_mail")
    assert mail.status == StepStatus.UNKNOWN
    item = Approval.objects.get(step=mail)
    assert (item.kind, item.status) == (ApprovalKind.RECONCILIATION, ApprovalStatus.PENDING)
    assert book["mails"] == [{"to": "ann@example.com", "text": "Refunded"}]
    # a person says it happened: the run goes on without sending it again
    lead = django_user_model.objects.get(username="lead")  # seed_demo's superuser
    services.reconcile(item.id, user=lead, resolution="happened", result={"sent": 1})
    wait_settled([mail_run.id], [world["worker"]])
    assert Run.objects.get(id=mail_run.id).status == RunStatus.SUCCEEDED
    assert ledger(world["ledger"])["mails"] == [{"to": "ann@example.com", "text": "Refunded"}]
