"""Amounts on the inbox card are shown and edited in the call's currency, never in cents (issue
34, item 2): the edit field takes "12.50" and the tool gets 1250; the edit policy's bounds are
said in the currency; after an edit the card's header, its arguments table and its form all
show the new proposal. The currency comes from the tool (`currency_arg`), else its context,
else what the run gathered; with none, the amount stays an integer in minor units.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agentruns.models import Step
from agentruns.registry import get_tool
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval, ApprovalStatus
from approvals.web.amounts import currency_of
from approvals.web.cards import card_for
from support.models import GatewayRefund
from tests.approvals.kit import parked_approval
from tests.helpers import advance

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


def decide(client: Client, approval: Approval, **fields: str):
    response = client.post(
        f"/approvals/{approval.id}/decide/",
        {"version": str(approval.version), "action": "approve", **fields},
        **HX,
    )
    return response["X-Decision-Status"], response.content.decode()


def test_the_card_takes_the_amount_in_the_currency_and_the_tool_gets_cents(approver):
    approval = parked_approval(amount=4599)  # the run's lookup says EUR
    client = Client()
    client.force_login(approver)
    html = client.get("/approvals/").content.decode()
    assert "(in EUR, e.g. 12.50)" in html and "(cents)" not in html
    assert "may only be lowered: from 0.01 up to 45.99 EUR (the requested value)" in html
    assert '<span class="money">45.99 EUR</span>' in html  # the arguments table
    for typed, message in (
        ("45.991", "amount_cents must be an amount like 12.50 EUR (got 45.991)"),
        ("46.00", "amount_cents must be at most 45.99 EUR (may only be lowered: from 0.01 up"),
        ("0", "amount_cents must be at least 0.01 EUR"),
    ):
        status, text = decide(client, approval, arg_amount_cents=typed, unit_amount_cents="EUR")
        assert status == "400" and message in text, text
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    status, text = decide(client, approval, arg_amount_cents="25,50", unit_amount_cents="EUR")
    assert status == "200", text
    approval.refresh_from_db()
    assert approval.edited_args["amount_cents"] == 2550
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == 2550


def test_after_an_edit_the_whole_card_shows_the_new_amount(seeded, settings):
    settings.REFUND_TWO_PERSON_CENTS = 1000  # two approvers: the item stays pending after one
    users = get_user_model().objects
    lead = users.get(username="lead")
    run = start_run("refund", {"order_id": "ORD-1001", "message": "It broke"}, user=lead).run
    advance(run)
    item = Approval.objects.get(run=run)
    first = Client()
    first.force_login(users.get(username="approver"))
    status, _ = decide(first, item, arg_amount_cents="100.00", unit_amount_cents="USD")
    assert status == "200"
    item.refresh_from_db()
    assert (item.status, item.edited_args["amount_cents"]) == ("pending", 10000)

    second = Client()
    second.force_login(users.get(username="approver2"))
    html = second.get("/approvals/").content.decode()
    card = html[html.index(f'id="approval-{item.id}"') :]
    assert 'data-cents="10000">100.00 USD</strong>' in card  # the header
    row = card[card.index('data-arg="amount_cents"') :].split("</tr>")[0]
    assert "<code>10000</code>" in row and '<span class="money">100.00 USD</span>' in row
    assert "(the agent asked for 247.11 USD)" in row  # the table: the proposal, the change marked
    assert 'value="100.00" data-original="100.00"' in card  # the form edits the proposal
    assert "may only be lowered: from 0.01 up to 247.11 USD (the requested value)" in card


def test_the_card_of_a_second_refund_shows_the_earlier_one_in_the_currency(seeded):
    GatewayRefund.objects.create(order_id="ORD-1001", amount_cents=4000, idempotency_key="k-1")
    lead = get_user_model().objects.get(username="lead")
    run = start_run("refund", {"order_id": "ORD-1001", "message": "refund the rest"}, user=lead)
    advance(run.run)
    card = card_for(Approval.objects.select_related("run", "step").get(run=run.run))
    facts = dict(card.context_view.facts)
    assert facts["refunded"] == "40.00 USD" and facts["remaining"] == "207.11 USD"
    assert "amount 40.00 USD" in facts["refunds"]
    assert card.amount == "207.11 USD"  # the agent proposes at most what is left (issue 44)


def test_where_the_currency_comes_from():
    refund = get_tool("issue_refund")
    assert refund.amount_arg == "amount_cents" and refund.currency_arg is None
    facts = [{"currency": "GBP"}]
    assert currency_of(refund, {}, {"currency": "USD"}, facts) == "USD"  # the tool's context
    assert currency_of(refund, {}, None, facts) == "GBP"  # else what the run gathered
    assert currency_of(refund, {}, None, []) == ""
    named = get_tool("ap_refund")
    object.__setattr__(named, "currency_arg", "reason")  # a declared argument wins
    try:
        assert currency_of(named, {"reason": "CHF"}, {"currency": "USD"}, facts) == "CHF"
    finally:
        object.__setattr__(named, "currency_arg", None)


def test_without_a_currency_the_amount_stays_in_minor_units(approver):
    approval = parked_approval(amount=4599)
    approval.run.input = {"message": "no facts"}
    Step.objects.filter(run=approval.run, tool="ap_lookup").update(result={"found": True})
    approval = Approval.objects.select_related("run", "step").get(id=approval.id)
    card = card_for(approval)
    field = next(f for f in card.fields if f.name == "amount_cents")
    assert (field.currency, field.input_value, field.attrs["max"]) == ("", "4599", 4599)
    assert field.hint == "may only be lowered: from 1 up to 4599 (the requested value)"
    decisions.approve(approval.id, user=approver, edited_args={"amount_cents": 4000}, version=1)
    assert Approval.objects.get(id=approval.id).edited_args["amount_cents"] == 4000
