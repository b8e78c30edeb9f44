"""End to end with the real worker (qcluster) and the real web server (daphne) as the gateway
and the API: refund runs park, staff decide over HTTP, the run finishes, and the gateway's
ledger and the outbox show what actually happened.
"""

from __future__ import annotations

import httpx
import pytest

from agentruns.models import Run, RunEvent, RunStatus, Step
from agentruns.services import start_run
from agentruns.tokens import create_token
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from support.models import GatewayRefund, Order, OutboxMessage
from tests.procs import gateway_refunds, module_web, start_worker, wait_finished, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAIT = 120


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup, django_db_blocker):
    """One daphne for the module: the API staff decide through and the refund gateway (no test
    restarts it; each test still sees only its own rows, the tables are truncated after it)."""
    with module_web(tmp_path_factory, django_db_blocker) as url:
        yield url


@pytest.fixture
def worker(tmp_path, web):
    procs = []

    def start(**env: object):
        env = {
            "REFUND_GATEWAY_URL": web + "/gateway",
            "REFUND_APPROVAL_THRESHOLD_CENTS": 0,  # the product default: every refund parks
            "AGENTRUNS_FAILPOINT_DIR": tmp_path / "failpoints",
            **env,
        }
        proc = start_worker(tmp_path, name=f"worker-{len(procs)}", **env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture
def staff_api(web, seeded, django_user_model):
    # the seeded demo approver: may decide approvals, is not a superuser
    token = create_token(django_user_model.objects.get(username="approver"))
    with httpx.Client(
        base_url=web, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client


def pending_item(run: Run, kind: str = ApprovalKind.APPROVAL) -> Approval:
    return wait_until(
        lambda: Approval.objects.filter(run=run, kind=kind, status=ApprovalStatus.PENDING).first(),
        timeout=WAIT,
        message=f"a pending {kind} for run {run.id}",
    )


def test_approve_with_a_lowered_amount_refunds_exactly_that_once(seeded, web, worker, staff_api):
    worker()
    order = Order.objects.get(order_id="ORD-1003")
    run = start_run(
        "refund", {"order_id": order.order_id, "message": "The kettle arrived broken"}
    ).run
    approval = pending_item(run)
    assert approval.requested_args["amount_cents"] == order.amount_cents
    lowered = order.amount_cents - 1000
    # the inbox's API lists it with the facts a person needs
    listed = staff_api.get("/api/approvals", params={"status": "pending"}).json()["approvals"]
    row = next(r for r in listed if r["id"] == approval.id)
    assert row["summary"]["customer"] == order.customer_name and row["summary"]["currency"] == "USD"

    response = staff_api.post(
        f"/api/approvals/{approval.id}",
        json={"decision": "approve", "args": {"amount_cents": lowered}, "reason": "partial refund"},
    )
    assert response.status_code == 200, response.text
    again = staff_api.post(f"/api/approvals/{approval.id}", json={"decision": "approve"})
    assert again.status_code == 409 and again.json()["decided_by"] == "approver"

    run = wait_finished(run, timeout=WAIT)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refunds = gateway_refunds(web, order.order_id)
    assert [r["amount_cents"] for r in refunds] == [lowered]
    step = Step.objects.get(id=approval.step_id)
    assert refunds[0]["idempotency_key"] == step.idempotency_key
    assert GatewayRefund.objects.filter(order_id=order.order_id).count() == 1
    reply = OutboxMessage.objects.get(run_id=run.id)
    assert f"we refunded {lowered / 100:,.2f} of {order.amount}" in reply.body
    assert "approved this amount: partial refund." in reply.body  # the approver's words
    decided = RunEvent.objects.get(run=run, type="approval.decided")
    assert decided.data["diff"] == {"amount_cents": {"from": order.amount_cents, "to": lowered}}
    assert decided.data["by"] == "approver"


def test_rejection_refunds_nothing_and_tells_the_customer_why(seeded, web, worker, staff_api):
    worker()
    run = start_run("refund", {"order_id": "ORD-1004", "message": "I changed my mind"}).run
    approval = pending_item(run)
    why = "the return window closed 30 days after delivery"
    response = staff_api.post(
        f"/api/approvals/{approval.id}", json={"decision": "reject", "reason": why}
    )
    assert response.status_code == 200, response.text
    run = wait_finished(run, timeout=WAIT)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert gateway_refunds(web, "ORD-1004") == []
    reply = OutboxMessage.objects.get(run_id=run.id)
    assert why in reply.body and "could not approve a refund" in reply.body


def test_an_unanswered_approval_expires_and_the_customer_is_told(seeded, web, worker):
    worker(AGENTRUNS_APPROVAL_EXPIRY_SECONDS=1)
    run = start_run("refund", {"order_id": "ORD-1005", "message": "Where is my refund?"}).run
    approval = pending_item(run)
    assert approval.expires_at is not None
    run = wait_finished(run, timeout=WAIT)  # nobody decides: the worker's sweeper expires it
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED and approval.reason == "expired"
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert gateway_refunds(web, "ORD-1005") == []
    assert "expired" in OutboxMessage.objects.get(run_id=run.id).body


@pytest.mark.parametrize(
    "failpoint, decision, sent_before, run_status, sent_after",
    [
        # the reply went out, then the worker died before recording it: staff say it happened
        ("tool_returned:send_customer_reply=crash_once", "happened", 1, RunStatus.SUCCEEDED, 1),
        # the worker died before sending: staff say it did not happen, the step runs again
        ("step_started:send_customer_reply=crash_once", "retry", 0, RunStatus.SUCCEEDED, 1),
        # nobody can tell: staff abort the run, nothing more is sent
        ("step_started:send_customer_reply=crash_once", "abort", 0, RunStatus.FAILED, 0),
    ],
)
def test_reconciliation_of_an_interrupted_customer_reply(
    seeded, web, worker, staff_api, failpoint, decision, sent_before, run_status, sent_after
):
    # no approval needed here: the refund goes straight through; the reply is the unknown step
    worker(REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000, AGENTRUNS_FAILPOINTS=failpoint)
    run = start_run("refund", {"order_id": "ORD-1006", "message": "Broken on arrival"}).run
    item = pending_item(run, ApprovalKind.RECONCILIATION)
    step = Step.objects.get(id=item.step_id)
    assert step.status == "unknown" and step.tool == "send_customer_reply"
    assert OutboxMessage.objects.filter(run_id=run.id).count() == sent_before
    body: dict = {"decision": decision, "reason": "checked the mail log"}
    if decision == "happened":
        body["result"] = {
            "outbox_id": OutboxMessage.objects.get(run_id=run.id).pk,
            "to": "customer",
        }
    response = staff_api.post(f"/api/approvals/{item.id}", json=body)
    assert response.status_code == 200, response.text
    run = wait_finished(run, timeout=WAIT)
    assert run.status == run_status, run.error
    if decision == "abort":
        assert run.stop_reason == "aborted"
    assert OutboxMessage.objects.filter(run_id=run.id).count() == sent_after
    assert len(gateway_refunds(web, "ORD-1006")) == 1  # the refund before it happened exactly once


def test_an_aborted_unknown_reply_is_never_mailed_again_by_retry(
    seeded, web, worker, staff_api, django_user_model
):
    """Issue 31: the mail went out, the worker was SIGKILLed before recording it, staff aborted;
    the lead's retry then mailed the customer a second time. Now the retry is refused with what
    to do instead, and resolving the step with the mail's result finishes the run on one mail."""
    worker(
        REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000,
        AGENTRUNS_FAILPOINTS="tool_returned:send_customer_reply=crash_once",
    )
    run = start_run("refund", {"order_id": "ORD-1009", "message": "Broken on arrival"}).run
    item = pending_item(run, ApprovalKind.RECONCILIATION)
    assert OutboxMessage.objects.filter(run_id=run.id).count() == 1  # sent before the kill
    aborted = staff_api.post(f"/api/approvals/{item.id}", json={"decision": "abort"})
    assert aborted.status_code == 200, aborted.text
    assert wait_finished(run, timeout=WAIT).status == RunStatus.FAILED

    lead = create_token(django_user_model.objects.get(username="lead"))  # may operate runs
    operator = {"Authorization": f"Bearer {lead}"}
    retried = httpx.post(f"{web}/api/runs/{run.id}/retry", headers=operator, json={}, timeout=30)
    run = wait_finished(run, timeout=WAIT)  # (had the retry queued it, the worker would run it)
    assert OutboxMessage.objects.filter(run_id=run.id).count() == 1  # what the customer got
    assert retried.status_code == 409 and "never run again" in retried.json()["error"]
    assert run.status == RunStatus.FAILED

    step = Step.objects.get(id=item.step_id)
    sent = OutboxMessage.objects.get(run_id=run.id)
    resolved = httpx.post(
        f"{web}/api/runs/{run.id}/steps/{step.index}/resolve",
        headers=operator,
        json={"result": {"outbox_id": sent.pk, "to": "customer"}},
        timeout=30,
    )
    assert resolved.status_code == 200, resolved.text
    run = wait_until(
        lambda: (r := Run.objects.get(id=run.id)).status == RunStatus.SUCCEEDED and r,
        timeout=WAIT,
        message="the resolved run to finish",
    )
    assert OutboxMessage.objects.filter(run_id=run.id).count() == 1
    assert len(gateway_refunds(web, "ORD-1009")) == 1
