"""The idempotency-key guarantee of retry, against the real refund gateway in a real server.

Attempt 1 of `issue_refund` reaches the gateway (which executes the refund) but the engine's
HTTP client gives up before the slow answer arrives; the automatic retries time out the same way
and the run fails. An operator fixes the cause (a longer client timeout) and presses retry: the
same step runs as a new attempt with the same Idempotency-Key, the gateway replays the refund it
already made, and its ledger shows exactly one refund.
"""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.services import retry_run, start_run
from support import agents as support_agents
from support.models import GatewayRefund
from tests.helpers import advance
from tests.procs import gateway_refunds, start_web, wait_until

GATEWAY_DELAY_MS = 1500
SHORT_TIMEOUT_S = 0.4


@pytest.fixture
def slow_gateway(tmp_path, settings, monkeypatch):
    web, url = start_web(tmp_path, REFUND_GATEWAY_DELAY_MS=GATEWAY_DELAY_MS)
    settings.REFUND_GATEWAY_URL = url + "/gateway"
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 10**9  # no approval: the point here is the retry
    settings.REFUND_GATEWAY_TIMEOUT_SECONDS = SHORT_TIMEOUT_S
    # the tool keeps one HTTP client per process; start from one built with these settings
    monkeypatch.setattr(support_agents, "_client", None)
    yield url
    web.stop()


@pytest.mark.django_db(transaction=True)
def test_retried_refund_reaches_the_ledger_once(
    seeded, operator, slow_gateway, settings, monkeypatch
):
    run = start_run(
        "refund",
        {"order_id": "ORD-1001", "message": "The blender arrived broken, refund $40 please"},
    ).run
    run = advance(run)
    assert run.status == RunStatus.FAILED, run.error
    refund_step = Step.objects.get(run=run, tool="issue_refund")
    key = refund_step.idempotency_key
    assert refund_step.status == StepStatus.FAILED and refund_step.attempts == 3
    assert "gateway unreachable" in refund_step.error
    # the engine never saw an answer, but the gateway executed the first attempt
    wait_until(
        lambda: GatewayRefund.objects.filter(idempotency_key=key).exists(),
        timeout=60,
        message="the timed-out attempt to land in the gateway ledger",
    )

    # the fix: give the gateway enough time to answer; then retry the failed run
    settings.REFUND_GATEWAY_TIMEOUT_SECONDS = 10
    monkeypatch.setattr(support_agents, "_client", None)
    retry_run(run.id, user=operator)
    run = advance(run)
    refund_step.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert refund_step.status == StepStatus.SUCCEEDED and refund_step.attempts == 4
    assert refund_step.idempotency_key == key

    refunds = gateway_refunds(slow_gateway, "ORD-1001")
    assert len(refunds) == 1, refunds
    assert refunds[0]["idempotency_key"] == key and refunds[0]["amount_cents"] == 4000
    assert GatewayRefund.objects.filter(idempotency_key=key).count() == 1
    # the step's result is the gateway's replay of the refund it made on attempt 1
    assert refund_step.result["refund_id"] == refunds[0]["id"]
    outcomes = list(refund_step.attempt_rows.order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["retrying", "retrying", "failed", "succeeded"]
    assert Run.objects.get(id=run.id).events.filter(type="run.retried").count() == 1
