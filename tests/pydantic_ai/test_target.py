"""Issue 32's first target, with real processes: a real `qcluster` worker, a real daphne serving
the fake payment gateway. The agent (`target.py`) has a structured output type, an instructions
function, an output validator that sends the model back once, and a model that cannot stream.

Two runs of it: each parks for approval, is approved in our inbox and refunds; the second run's
worker is SIGKILLed right after the refund returned (failpoint `tool_returned:tgt_refund`, before
its result was stored). Each run made exactly one refund (the gateway's own ledger, by the
step's idempotency key), and its `output` is the validated object, the same with the kill as
without it. Assertions are on the gateway's ledger, the database rows and the API.
"""

from __future__ import annotations

import json

import pytest

from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import Approval, ApprovalStatus
from support.models import GatewayRefund
from tests.crash.kit import attempt_outcomes, wait_settled
from tests.helpers import ApiClient, assert_gapless, steps
from tests.procs import gateway_refunds, start_web, start_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]


def _parked(run_id) -> Approval:
    def asked() -> Approval | Run | None:
        run = Run.objects.get(id=run_id)
        if run.status in (RunStatus.FAILED, RunStatus.SUCCEEDED, RunStatus.CANCELLED):
            return run  # ended without asking anybody
        return Approval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).first()

    found = wait_until(asked, timeout=120, interval=0.2, message="the refund waiting for approval")
    assert isinstance(found, Approval), (found.status, found.error)
    return found


def test_structured_output_agent_refunds_once_with_and_without_a_kill(
    tmp_path, procs, seeded, django_user_model
):
    from tests.pydantic_ai import target  # noqa: F401  (this process starts the runs)

    web, gateway = start_web(tmp_path)
    procs.append(web)
    failpoints = tmp_path / "failpoints"
    worker = start_worker(
        tmp_path,
        name="target-worker",
        AGENTRUNS_AGENT_MODULES="tests.pydantic_ai.target",
        REFUND_GATEWAY_URL=gateway + "/gateway",
        AGENTRUNS_FAILPOINTS="tool_returned:tgt_refund=crash_once",
        AGENTRUNS_FAILPOINT_DIR=failpoints,
        AGENTRUNS_RUNS_PER_PROCESS=1,
    )
    procs.append(worker)
    lead = django_user_model.objects.get(username="lead")  # seed_demo's superuser
    outputs = {}
    for order, killed in (("ORD-1011", False), ("ORD-1012", True)):
        message = json.dumps({"order_id": order, "amount_cents": 1000})
        run = start_run("pa-target", {"message": message}).run
        approval = _parked(run.id)
        refund = Step.objects.get(run=run, tool="tgt_refund")
        assert refund.status == StepStatus.WAITING_APPROVAL
        assert approval.requested_args == {"order_id": order, "amount_cents": 1000}
        assert not GatewayRefund.objects.filter(order_id=order).exists()  # asked, not done
        if not killed:  # its failpoint counts as hit: this run's worker is not killed
            failpoints.mkdir(exist_ok=True)
            (failpoints / f"tool_returned-tgt_refund-{refund.id}").touch()
        services.approve(approval.id, user=lead)
        wait_settled([run.id], [worker])
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, (order, run.error)
        refund.refresh_from_db()
        rows = list(GatewayRefund.objects.filter(order_id=order))
        assert [(r.amount_cents, r.idempotency_key) for r in rows] == [
            (1000, refund.idempotency_key)
        ]
        assert [r["idempotency_key"] for r in gateway_refunds(gateway, order)] == [
            refund.idempotency_key
        ]
        expected = {"order_id": order, "amount_cents": 1000, "refund_id": f"rf_{rows[0].pk}"}
        assert run.output_data == expected
        assert json.loads(run.output) == expected
        body = ApiClient(lead).get(f"/api/runs/{run.id}").json()
        assert body["output"] == expected
        # asked for the refund, answered twice (the validator sent the first answer back)
        assert [(s.kind, s.tool) for s in steps(run)] == [
            ("model", ""),
            ("tool", "tgt_refund"),
            ("model", ""),
            ("model", ""),
        ]
        outcomes = attempt_outcomes(refund)
        if killed:  # the call returned, the worker died before storing it: run again, same key
            assert outcomes == [(1, AttemptOutcome.CRASHED), (2, AttemptOutcome.SUCCEEDED)]
        else:
            assert outcomes == [(1, AttemptOutcome.SUCCEEDED)]
        assert Approval.objects.filter(step=refund).count() == 1
        assert_gapless(run)
        outputs[killed] = {k: v for k, v in run.output_data.items() if k != "refund_id"}
    assert outputs[True] | {"order_id": "-"} == outputs[False] | {"order_id": "-"}
