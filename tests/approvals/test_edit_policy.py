"""The demo refund's edit policy (DESIGN.md 4.6, 6): `order_id` fixed, `amount_cents` an integer
from 1 up to the requested amount, `reason` free. An edit outside it is a 400 that names the
field and the rule, records nothing and refunds nothing; the inbox shows the same message in
place; an allowed lower amount is exactly what the real gateway executes.
"""

from __future__ import annotations

import re

import httpx
import pytest
from django.test import Client

from agentruns.models import Run, RunEvent, RunStatus, Step
from agentruns.runtime.values.money import major_text
from agentruns.services import start_run
from agentruns.tokens import create_token
from approvals.models import Approval, ApprovalDecision, ApprovalStatus
from support.models import GatewayRefund, Order
from tests.conftest import ApiClient
from tests.helpers import advance
from tests.procs import start_web, start_worker, wait_until

ORDER = "ORD-1001"

REFUSED = [
    # (edit, field, rule)
    ({"order_id": "ORD-1002"}, "order_id", "fixed"),  # another order
    ({"amount_cents": "REQUESTED+1"}, "amount_cents", "at_most_requested"),  # raised
    ({"amount_cents": 5.0}, "amount_cents", "type"),  # 5.0 is not an integer
    ({"amount_cents": 9999999.0}, "amount_cents", "type"),
    ({"amount_cents": True}, "amount_cents", "type"),  # neither is true
    ({"amount_cents": -5}, "amount_cents", "minimum"),  # negative
    ({"amount_cents": 0}, "amount_cents", "minimum"),
    ({"amount_cents": None}, "amount_cents", "required"),  # missing
    ({"reason": 42}, "reason", "type"),
    ({"refund_to": "elsewhere"}, "refund_to", "unknown"),
]


def parked_refund() -> Approval:
    run = advance(start_run("refund", {"order_id": ORDER, "message": "The blender broke"}).run)
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.select_related("run", "step").get(run=run)


def _edit(edit: dict, requested: int) -> dict:
    return {k: (requested + 1 if v == "REQUESTED+1" else v) for k, v in edit.items()}


@pytest.fixture
def approver(seeded, settings, django_user_model):
    """seed_demo's approver; every refund parks for approval."""
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    return django_user_model.objects.get(username="approver")


@pytest.mark.django_db
@pytest.mark.parametrize("edit, field, rule", REFUSED)
def test_every_edit_outside_the_policy_is_a_400_and_changes_nothing(approver, edit, field, rule):
    approval = parked_refund()
    requested = approval.requested_args["amount_cents"]
    assert requested == Order.objects.get(order_id=ORDER).amount_cents
    events = RunEvent.objects.filter(run=approval.run).count()
    response = ApiClient(approver).post(
        f"/api/approvals/{approval.id}", {"decision": "approve", "args": _edit(edit, requested)}
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["field"] == field and body["rule"] == rule
    assert field in body["error"] and body["error"].startswith("edit refused")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and approval.edited_args is None
    assert not ApprovalDecision.objects.exists()
    assert RunEvent.objects.filter(run=approval.run).count() == events
    assert Run.objects.get(id=approval.run_id).status == RunStatus.WAITING
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == requested
    assert GatewayRefund.objects.count() == 0


@pytest.mark.django_db
def test_the_rule_in_words_and_the_same_refusal_in_the_inbox(approver):
    approval = parked_refund()
    requested = approval.requested_args["amount_cents"]
    client = Client()
    client.force_login(approver)
    html = client.get("/approvals/").content.decode()
    # order_id is shown fixed, not as an input; the amount input is bounded by the request
    assert 'name="arg_order_id"' not in html and 'data-fixed="order_id"' in html
    # in the order's currency (issue 34): typed as 247.11, bounded from 0.01 to the request
    shown = major_text(requested)
    assert re.search(rf'name="arg_amount_cents"[^>]*min="0.01"[^>]*max="{shown}"', html)
    assert f"may only be lowered: from 0.01 up to {shown} USD (the requested value)" in html
    api = ApiClient(approver)
    for typed, sent in ((str(requested + 100), requested + 100), ("5.0", 5.0)):
        api_error = api.post(
            f"/api/approvals/{approval.id}", {"decision": "approve", "args": {"amount_cents": sent}}
        ).json()["error"]
        response = client.post(
            f"/approvals/{approval.id}/decide/",
            {"version": "1", "action": "approve", "arg_amount_cents": typed},
            HTTP_HX_REQUEST="true",
        )
        assert response["X-Decision-Status"] == "400"
        assert api_error in response.content.decode()  # the very message the API gives
    # the form as the inbox sends it: the amount in the currency, refused in it
    response = client.post(
        f"/approvals/{approval.id}/decide/",
        {"version": "1", "action": "approve", "arg_amount_cents": major_text(requested + 100),
         "unit_amount_cents": "USD"},
        HTTP_HX_REQUEST="true",
    )  # fmt: skip
    assert response["X-Decision-Status"] == "400"
    assert (
        f"edit refused: amount_cents must be at most {shown} USD (may only be lowered: from "
        f"0.01 up to {shown} USD (the requested value))" in response.content.decode()
    )
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    assert GatewayRefund.objects.count() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_refused_edits_refund_nothing_and_a_lower_amount_is_what_the_gateway_executes(
    seeded, tmp_path, django_user_model
):
    web, url = start_web(tmp_path)
    worker = start_worker(
        tmp_path, REFUND_GATEWAY_URL=url + "/gateway", REFUND_APPROVAL_THRESHOLD_CENTS=0
    )
    try:
        token = create_token(django_user_model.objects.get(username="approver"))
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        run = start_run("refund", {"order_id": ORDER, "message": "The blender broke"}).run
        approval = wait_until(
            lambda: Approval.objects.filter(run=run, status="pending").first(),
            timeout=120,
            message="the refund to park",
        )
        requested = approval.requested_args["amount_cents"]
        decide = f"/api/approvals/{approval.id}"

        def ledger() -> list[dict]:
            return api.get("/gateway/refunds", params={"order_id": ORDER}).json()["refunds"]

        for edit, field, _ in REFUSED:
            response = api.post(
                decide, json={"decision": "approve", "args": _edit(edit, requested)}
            )
            assert response.status_code == 400 and response.json()["field"] == field
        assert ledger() == [] and Run.objects.get(id=run.id).status == RunStatus.WAITING

        lowered = requested - 1234
        response = api.post(
            decide,
            json={"decision": "approve", "args": {"amount_cents": lowered, "reason": "partial"}},
        )
        assert response.status_code == 200 and response.json()["status"] == "approved"

        def done():
            fresh = Run.objects.get(id=run.id)
            return fresh if fresh.is_terminal else None

        finished = wait_until(done, timeout=120, message="the run to finish")
        assert finished.status == RunStatus.SUCCEEDED, finished.error
        refunds = ledger()
        assert [(r["order_id"], r["amount_cents"]) for r in refunds] == [(ORDER, lowered)]
        assert (
            refunds[0]["idempotency_key"] == Step.objects.get(id=approval.step_id).idempotency_key
        )
        row = ApprovalDecision.objects.get(approval=approval)
        assert row.username == "approver" and row.edited and row.args["amount_cents"] == lowered
        assert row.args["order_id"] == ORDER
    finally:
        worker.stop()
        web.stop()
