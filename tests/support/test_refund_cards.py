"""The inbox's refund cards read their orders together (issue 44: the desk's pages at scale): the
refund tool's context (`support.ledger.refund_context`, its `many`) gives a page of cards the
order, its refunds with the request each paid, and the totals in the queries of one card, each
card the same as read alone. On PostgreSQL, the items parked by the refund agent itself, the
refunds written as the gateway and the runtime record them (no gateway here)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentruns.models import OperationExecution, OperationState
from agentruns.services import start_run
from approvals.domain.context import contexts
from approvals.models import Approval
from support.ledger import refund_context, refund_contexts, refund_key
from support.models import GatewayRefund, Order, Ticket
from tests.helpers import advance

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(seeded, settings, django_user_model) -> dict:
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0  # every refund waits in the inbox
    return {u.username: u for u in django_user_model.objects.all()}


def pending_refund(order_id: str, ticket_id: str | None = None) -> Approval:
    run_input = {"order_id": order_id, "message": "it arrived broken"}
    if ticket_id:
        run_input["ticket_id"] = ticket_id
    run = advance(start_run("refund", run_input).run)
    assert run.status == "waiting", (run.status, run.outcome, run.error)
    return Approval.objects.get(run=run, status="pending")


def paid(order_id: str, amount_cents: int, ticket_id: str | None) -> str:
    """A refund the gateway made, and (with a ticket) the request's key done with it, as the
    refund tool's execution records it; None: a refund from before refunds named their ticket."""
    row = GatewayRefund.objects.create(
        order_id=order_id, amount_cents=amount_cents, idempotency_key=uuid.uuid4().hex
    )
    if ticket_id:
        OperationExecution.objects.create(
            key=refund_key(ticket_id),
            slot=1,
            state=OperationState.DONE,
            run_id=uuid.uuid4(),
            step_id=uuid.uuid4(),
            tool="issue_refund",
            result={"refund_id": f"rf_{row.pk}", "amount_cents": amount_cents},
        )
    return f"rf_{row.pk}"


def inbox_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/approvals/")
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_a_page_of_refund_cards_reads_their_orders_at_once(people):
    order = Order.objects.get(order_id="ORD-1001")
    Ticket.objects.create(ticket_id="T-1001-2", order=order, subject="Again", body="Still broken")
    other = Order.objects.get(order_id="ORD-1002")
    Ticket.objects.create(ticket_id="T-1002-2", order=other, subject="Also", body="And this")
    earlier = paid("ORD-1001", 1500, None)
    first = paid("ORD-1001", 2000, "T-1001")
    paid("ORD-1002", 700, "T-1002-2")
    again = pending_refund("ORD-1001", "T-1001-2")
    client = Client()
    client.force_login(people["approver"])
    few = inbox_queries(client)
    others = [pending_refund(f"ORD-{n}") for n in range(1002, 1008)]
    assert inbox_queries(client) == few  # six more refund cards, not a query more

    alone = contexts([again])[again.id]
    assert alone is not None
    refunds = [(r["id"], r["amount_cents"], r["ticket_id"]) for r in alone["refunds"]]
    assert refunds == [(earlier, 1500, None), (first, 2000, "T-1001")]  # the request each paid
    assert alone["refunded_cents"] == 3500
    assert alone["remaining_cents"] == max(0, order.amount_cents - 3500)
    together = contexts([again, *others])
    assert together[again.id] == alone  # each card as read alone
    for item in others:
        assert together[item.id] == contexts([item])[item.id]
    assert [r["ticket_id"] for r in together[others[0].id]["refunds"]] == ["T-1002-2"]


def test_refund_contexts_answer_each_call_in_order_in_fixed_queries(people):
    calls = [
        {"order_id": "ORD-1003", "ticket_id": "T-1003"},
        {"order_id": "ORD-404"},
        {"order_id": None},
        {"order_id": "ORD-1004"},
        {"order_id": "ORD-1003"},
    ]
    with CaptureQueriesContext(connection) as ctx:
        found = refund_contexts(calls)
    assert len(ctx.captured_queries) <= 2  # the orders and their ledger (no refunds yet)
    assert found == [refund_context(call) for call in calls]
    assert found[1] == {"order": None, "note": "no order ORD-404"}
    assert found[2] == {"order": None, "note": "no order None"}
    assert [f["order"]["order_id"] for f in (found[0], found[3], found[4])] == [
        "ORD-1003",
        "ORD-1004",
        "ORD-1003",
    ]
    assert found[0]["ticket_id"] == "T-1003" and found[4]["ticket_id"] is None


def card_of(html: str, approval_id: int) -> str:
    """The item's own card on a page."""
    start = html.index(f'id="approval-{approval_id}"')
    return html[start : html.index("</article>", start)]


def test_a_refund_recorded_after_the_inbox_showed_the_card_shows_at_once(people):
    """The card's head and body are cached by everything they show (`Card.shown_fingerprint`):
    a refund the gateway records shows in the card's facts on the next page, not later."""
    item = pending_refund("ORD-1001", "T-1001")
    client = Client()
    client.force_login(people["approver"])
    before = card_of(client.get("/approvals/").content.decode(), item.id)
    assert "<dt>refunds</dt><dd>none</dd>" in before
    paid("ORD-1001", 2000, None)
    after = card_of(client.get("/approvals/").content.decode(), item.id)
    assert "<dt>refunds</dt><dd>none</dd>" not in after
    assert "<dt>refunded</dt><dd>20.00 USD</dd>" in after
