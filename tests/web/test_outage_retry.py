"""The issue's "done when", with the real worker and server: the gateway is down, the run fails,
the lead sees it in the failed list with the error, the gateway comes back, the lead presses retry,
and the run finishes with one refund in the gateway's ledger."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from agentruns.models import Run, RunStatus, Step, StepStatus
from tests.procs import gateway_refunds, start_web, start_worker, wait_finished


@pytest.mark.django_db(transaction=True)
def test_outage_then_retry_finishes_with_one_refund(seeded, operator, client, tmp_path):
    web, url = start_web(tmp_path, REFUND_GATEWAY_FAIL=1)
    port = int(url.rsplit(":", 1)[1])
    worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway")
    procs = [web, worker]
    try:
        operator.user_permissions.add(Permission.objects.get(codename="start_run"))
        client.force_login(operator)
        created = client.post(
            "/runs/new/",
            {
                "agent": "refund",
                "input": json.dumps({"order_id": "ORD-1002", "message": "It broke, refund $25"}),
            },
        )
        assert created.status_code == 302
        run = Run.objects.get(agent="refund", input__order_id="ORD-1002")
        run = wait_finished(run, worker)
        assert run.status == RunStatus.FAILED, run.error

        # the morning view: the failed run, its error, in the failed list
        listing = client.get("/runs/?status=failed").content.decode()
        assert str(run.id) in listing and "gateway answered 503" in listing
        refund = Step.objects.get(run=run, tool="issue_refund")
        assert refund.status == StepStatus.FAILED and refund.attempts == 3
        assert gateway_refunds(url, "ORD-1002") == []

        # the outage ends (the gateway restarts healthy on the same address), then: retry
        web.stop()
        healthy, same_url = start_web(tmp_path, port=port)
        procs.append(healthy)
        assert same_url == url
        response = client.post(f"/runs/{run.id}/retry/", follow=True)
        assert b"Retry queued" in response.content
        run = wait_finished(run, worker)
        assert run.status == RunStatus.SUCCEEDED, run.error

        refund.refresh_from_db()
        assert refund.status == StepStatus.SUCCEEDED and refund.attempts == 4
        ledger = gateway_refunds(url, "ORD-1002")
        assert len(ledger) == 1
        assert ledger[0]["idempotency_key"] == refund.idempotency_key
        assert ledger[0]["amount_cents"] == 2500
        page = client.get(f"/runs/{run.id}/").content.decode()
        assert "run.retried" in page and "operator" in page
    finally:
        for proc in procs:
            proc.stop()
