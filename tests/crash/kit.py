"""What the crash tests check alike: the gateway's own ledger after a crash."""

from __future__ import annotations

from agentruns.models import Run, Step, StepStatus
from support.models import GatewayRefund
from tests.procs import gateway_refunds


def assert_refunded_exactly_once(url: str, order_id: str, amount: int, run: Run) -> Step:
    """The gateway's own ledger (its table and its HTTP listing) shows one refund of `amount`,
    made with the idempotency key of the run's single issue_refund step."""
    refund_step = Step.objects.get(run=run, tool="issue_refund")
    rows = list(GatewayRefund.objects.filter(order_id=order_id))
    assert len(rows) == 1, f"{order_id}: {len(rows)} refunds in the ledger"
    assert rows[0].amount_cents == amount
    assert rows[0].idempotency_key == refund_step.idempotency_key
    listed = gateway_refunds(url, order_id)
    assert [(r["amount_cents"], r["idempotency_key"]) for r in listed] == [
        (amount, refund_step.idempotency_key)
    ]
    assert refund_step.status == StepStatus.SUCCEEDED
    assert refund_step.result["refund_id"] == f"rf_{rows[0].pk}"
    assert refund_step.result["amount_cents"] == amount
    return refund_step
