"""Limits that add up and the cross-run context (issue 30, item 3), and the lead's "one more"
from the inbox (item 2), through every door of the decision: the API, the inbox card.

The runs are the real engine's, with the keyed refund tools of tests/testkit.py (declared like
the demo's `issue_refund`: `refund:<order>`, refunds adding up to what was paid, the order's
refunds as the context) writing to the gateway's ledger table.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from agentruns.models import RunEvent, RunStatus, Step, StepStatus
from agentruns.runtime.events import EventType
from approvals.models import Approval, ApprovalDecision, ApprovalKind, ApprovalStatus
from support.models import GatewayRefund, Order
from tests import testkit
from tests.helpers import ApiClient, advance, assert_json_error, make_user
from tests.testkit import refund_run

from .kit import login

pytestmark = pytest.mark.django_db

PAID = 35818
HX = {"HTTP_HX_REQUEST": "true"}


def order(order_id: str = "ORD-9001", name: str = "Ada Lovelace") -> Order:
    return Order.objects.create(
        order_id=order_id,
        customer_name=name,
        customer_email="ada@example.com",
        amount_cents=PAID,
        currency="USD",
        item="Blender",
    )


def refunded(order_id: str, amount: int):
    """A run that refunded `amount` of the order (no approval needed)."""
    run = advance(refund_run(order_id, amount))
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def parked(order_id: str, amount: int) -> Approval:
    run = advance(refund_run(order_id, amount, tool="t_refund_approved"))
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.select_related("run", "step").get(run=run, kind=ApprovalKind.APPROVAL)


def decide(user, approval: Approval, **body):
    return ApiClient(user).post(
        f"/api/approvals/{approval.id}", {"decision": "approve", "version": 1, **body}
    )


# ------------------------------------------------------------------ the order's limit
def test_an_approval_over_the_orders_refunds_is_refused_with_the_figures(lead):
    order()
    refunded("ORD-9001", 30_000)
    ApiClient(lead).post("/api/operation-keys/refund:ORD-9001/allow", {"reason": "2nd item"})
    approval = parked("ORD-9001", 12_000)

    body = assert_json_error(decide(lead, approval), 422)
    assert body["error"] == (
        "approving is refused: this refund of 120.00 USD would bring the order's refunds to "
        "420.00 of 358.18 USD paid"
    )
    assert body["code"] == "over_limit"
    assert body["figures"] == {
        "order_id": "ORD-9001",
        "amount_cents": 12_000,
        "refunded_cents": 30_000,
        "total_cents": 42_000,
        "paid_cents": PAID,
        "currency": "USD",
    }
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and approval.version == 1
    assert not ApprovalDecision.objects.filter(approval=approval).exists()

    # lowered to what is left, it is approved and made
    ok = decide(lead, approval, args={"amount_cents": 5_818})
    assert ok.status_code == 200 and ok.json()["status"] == ApprovalStatus.APPROVED
    advance(approval.run)
    assert sum(GatewayRefund.objects.values_list("amount_cents", flat=True)) == PAID


def test_the_inbox_card_says_why_an_approval_over_the_limit_is_refused(client, lead):
    order()
    refunded("ORD-9001", 30_000)
    ApiClient(lead).post("/api/operation-keys/refund:ORD-9001/allow", {"reason": "2nd item"})
    approval = parked("ORD-9001", 12_000)
    response = login(client, lead).post(
        reverse("approval-decide", args=[approval.id]),
        {"action": "approve", "version": "1"},
        **HX,
    )
    assert response["X-Decision-Status"] == "422"
    html = response.content.decode()
    assert (
        "this refund of 120.00 USD would bring the order&#x27;s refunds to 420.00 of 358.18 "
        "USD paid" in html
    )
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


def test_a_blocked_call_is_approved_without_the_limit_and_answered_already_done(lead):
    """Two runs on one order both park; both are approved: the second is not refused by the
    order's limit the first filled, because it will not be made; its model is told."""
    order()
    first, second = parked("ORD-9001", PAID), parked("ORD-9001", PAID)
    assert decide(lead, first).status_code == 200
    made = advance(first.run)
    assert decide(lead, second).status_code == 200
    told = advance(second.run)
    assert made.status == told.status == RunStatus.SUCCEEDED
    assert GatewayRefund.objects.count() == 1
    step = Step.objects.get(id=second.step_id)
    assert step.result["already_done"] is True and step.result["done_by_run"] == str(made.id)


def test_an_approval_whose_call_paid_nothing_says_so_everywhere(client, lead):
    """Issue 44: approved, and nothing was paid (its key was done meanwhile): the API's
    `not_made`, the item page (its chip and its line) and the decided view say so; the call
    that was made reads as plainly approved."""
    order()
    first, second = parked("ORD-9001", PAID), parked("ORD-9001", PAID)
    assert decide(lead, first).status_code == 200
    advance(first.run)
    assert decide(lead, second).status_code == 200
    advance(second.run)
    assert GatewayRefund.objects.count() == 1

    listed = ApiClient(lead).get("/api/approvals?status=approved").json()["approvals"]
    by_id = {a["id"]: a for a in listed}
    assert by_id[first.id]["not_made"] is None
    assert re.fullmatch(
        r"it was already done on [A-Z][a-z]{2} \d{1,2}, \d{2}:\d{2}, so it was not done again",
        by_id[second.id]["not_made"],
    )
    login(client, lead)
    item = client.get(reverse("approval-item", args=[second.id])).content.decode()
    assert ">approved, not paid<" in item  # the chip: never a plain "approved"
    assert "Approved, not paid: it was already done on " in item
    decided = client.get(reverse("approval-decided")).content.decode()
    card = decided[decided.index(f'id="decided-{second.id}"') :].split("</article>")[0]
    assert "approved, not paid: it was already done on " in card and "s-failed" in card
    made = decided[decided.index(f'id="decided-{first.id}"') :].split("</article>")[0]
    assert "not paid" not in made and ">approved<" in made


# ------------------------------------------------------------------ an approver's day
def test_an_approvers_total_per_day_is_capped(settings, approver, lead, django_user_model):
    settings.AGENTRUNS_APPROVER_DAILY_LIMIT_CENTS = 50_000
    order("ORD-9001")
    order("ORD-9002")
    order("ORD-9003")
    assert decide(approver, parked("ORD-9001", 30_000)).status_code == 200
    second = parked("ORD-9002", 25_000)

    body = assert_json_error(decide(approver, second), 403)
    assert body["code"] == "over_daily_limit"
    assert body["error"] == (
        "approving 250.00 would bring your approvals today to 550.00, above your daily limit "
        "of 500.00: ask another approver"
    )
    assert body["figures"] == {
        "amount": 25_000,
        "approved_today": 30_000,
        "total": 55_000,
        "daily_limit": 50_000,
    }
    assert decide(approver, second, args={"amount_cents": 20_000}).status_code == 200
    other = make_user(
        django_user_model,
        "approver3",
        ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
    )
    assert decide(other, parked("ORD-9003", 30_000)).status_code == 200  # their own day
    assert decide(lead, parked("ORD-9003", 1_000)).status_code == 200  # superusers: none


# ------------------------------------------------------------------ the cross-run context
def test_the_api_item_and_the_card_show_the_orders_refunds_and_pending_items(client, viewer):
    order(name="Ada <b>Lovelace</b>")
    # parked before another run refunded the order: a call whose key is used never parks
    blocked = parked("ORD-9001", 20_000)
    other = parked("ORD-9001", 5_000)
    done = refunded("ORD-9001", 10_000)

    items = {a["id"]: a for a in ApiClient(viewer).get("/api/approvals").json()["approvals"]}
    context = items[blocked.id]["context"]
    refund = GatewayRefund.objects.get()
    assert context["order"] == {
        "order_id": "ORD-9001",
        "customer_name": "Ada <b>Lovelace</b>",
        "item": "Blender",
        "paid_cents": PAID,
    }
    assert context["currency"] == "USD"
    assert [(r["id"], r["amount_cents"]) for r in context["refunds"]] == [
        (f"rf_{refund.pk}", 10_000)
    ]
    assert (context["refunded_cents"], context["remaining_cents"]) == (10_000, PAID - 10_000)
    operation = context["operation"]
    assert (operation["key"], operation["status"], operation["allowed"]) == (
        "refund:ORD-9001",
        "used",
        1,
    )
    assert [(e["run_id"], e["state"]) for e in operation["executions"]] == [(str(done.id), "done")]
    assert [(p["approval"], p["run_id"], p["amount"]) for p in context["pending"]] == [
        (other.id, str(other.run_id), 5_000)
    ]
    assert context["pending_total"] == 5_000
    assert items[other.id]["context"]["pending"][0]["approval"] == blocked.id

    html = login(client, viewer).get("/approvals/").content.decode()
    card = html[html.index(f'id="approval-{blocked.id}"') :]
    card = card[: card.index("</article>")]
    assert "Ada &lt;b&gt;Lovelace&lt;/b&gt;" in card and "<b>Lovelace" not in card
    assert "paid 358.18 USD" in card
    assert "refunded</dt><dd>100.00 USD" in card and "remaining</dt><dd>258.18 USD" in card
    # in words: the key is the card's data-key (and in its call's detail), not its sentence
    assert 'data-key="refund:ORD-9001"' in card and "Already done by another run on " in card
    assert "approving will not do it again" in card
    assert f"#{other.id} · 50.00 USD · waiting since " in card
    assert "Allow it to be done once more" not in card  # a viewer may not


def test_a_decided_item_carries_no_context(lead):
    order()
    approval = parked("ORD-9001", 1_000)
    assert decide(lead, approval).json()["context"] is None


# ------------------------------------------------------------------ one more, from the inbox
def test_a_lead_allows_one_more_from_the_blocked_calls_card(client, lead, approver):
    order()
    blocked = parked("ORD-9001", 20_000)
    refunded("ORD-9001", 10_000)
    url = reverse("approval-allow", args=[blocked.id])

    page = login(Client(), lead).get("/approvals/").content.decode()
    assert f'action="{url}"' in page and "Allow it to be done once more" in page

    refused = login(Client(), approver).post(url, {"reason": "me too"}, **HX)
    assert refused.status_code == 403
    response = login(client, lead).post(url, {"reason": "a second item was returned"}, **HX)
    assert response.status_code == 200 and response["X-Claim-Status"] == "200"
    html = response.content.decode()
    assert "It may be done once more now" in html
    assert "Done 1 of the 2 times allowed: approving makes this call" in html
    audit = RunEvent.objects.get(run_id=blocked.run_id, type=EventType.OPERATION_ALLOWED)
    assert audit.data == {
        "key": "refund:ORD-9001",
        "slot": 2,
        "by": "lead",
        "reason": "a second item was returned",
    }
    again = client.post(url, {"reason": "twice"}, **HX)
    assert again["X-Claim-Status"] == "409" and "already allowed" in again.content.decode()

    assert decide(lead, blocked).status_code == 200
    advance(blocked.run)
    assert sorted(GatewayRefund.objects.values_list("amount_cents", flat=True)) == [10_000, 20_000]
    assert Step.objects.get(id=blocked.step_id).status == StepStatus.SUCCEEDED
    assert len(testkit.CALLS["t_refund_approved"]) == 1


def test_the_operation_key_api(lead, viewer, operator):
    order()
    done = refunded("ORD-9001", 10_000)
    state = ApiClient(viewer).get("/api/operation-keys/refund:ORD-9001")
    assert state.status_code == 200
    assert state.json()["status"] == "used"
    assert state.json()["executions"][0]["result"]["amount_cents"] == 10_000

    assert_json_error(ApiClient(viewer).post("/api/operation-keys/refund:ORD-9001/allow", {}), 403)
    allowed = ApiClient(operator).post(
        "/api/operation-keys/refund:ORD-9001/allow", {"reason": "x", "run_id": str(done.id)}
    )
    assert allowed.status_code == 201
    assert allowed.json()["allowed"]["slot"] == 2 and allowed.json()["key"]["status"] == "free"
    assert_json_error(
        ApiClient(operator).post("/api/operation-keys/refund:ORD-9001/allow", {}), 409
    )
    assert_json_error(ApiClient(operator).post("/api/operation-keys/never-used/allow", {}), 409)
    assert_json_error(ApiClient(viewer).get("/api/operation-keys/%20padded"), 404)
    assert_json_error(ApiClient(operator).post("/api/operation-keys/k/allow", {"reason": 5}), 400)


def test_the_inbox_poll_shows_another_runs_call_of_an_items_key(client, viewer):
    """The poll answers 204 while nothing changed; a refund of the item's order made by another
    run changes the card (its key is used now), so the poll sends it."""
    order()
    blocked = parked("ORD-9001", 20_000)
    login(client, viewer)
    fragment = client.get("/approvals/?fragment=items", **HX).content.decode()
    signature = re.search(r'id="inbox-state" data-signature="([0-9a-f]+)"', fragment).group(1)
    poll = f"/approvals/?fragment=items&sig={signature}"
    assert client.get(poll, **HX).status_code == 204
    assert "Not done yet: approving makes this call" in fragment

    refunded("ORD-9001", 10_000)
    response = client.get(poll, **HX)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="approval-{blocked.id}"' in html
    assert "Already done by another run on " in html
