"""The order's cap across its requests (issue 44, item 1), on PostgreSQL with real concurrent
transactions: each request (ticket) takes its own operation key, so two requests of one order are
not kept apart by their keys; the refund limit serialises them on the order's row and counts the
refunds in flight of the order's other requests. Two calls racing through the runtime's own gate
for more than half of what was paid each: exactly one goes.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from agentruns.models import OperationExecution, Run, Step, StepKind
from agentruns.registry import get_tool
from agentruns.runtime.operations import gate as operations
from agentruns.services import start_run
from support.ledger import refund_limit
from support.models import GatewayRefund, Order, Ticket
from tests.helpers import race

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "ORD-1050"


def refund_call(ticket_id: str, amount: int) -> tuple[Run, Step]:
    """A run on the ticket and its planned refund call (as the model's turn plans it)."""
    run_input = {"order_id": ORDER, "ticket_id": ticket_id, "message": "refund"}
    run = start_run("refund", run_input, enqueue_task=False).run
    args = {"order_id": ORDER, "ticket_id": ticket_id, "amount_cents": amount, "reason": "r"}
    step = Step.objects.create(
        run=run,
        index=1,
        kind=StepKind.TOOL,
        tool="issue_refund",
        arguments=args,
        idempotency_key=f"k-{ticket_id}",
    )
    return run, step


def through_the_gate(run: Run, step: Step) -> str:
    """The executor's "before" commit of the call: key and limit in one transaction, committed a
    moment later (the other call must wait for it, never read around it)."""
    with transaction.atomic():
        answer = operations.gate(run, step, get_tool("issue_refund"), first_attempt=True)
        time.sleep(0.3)
    return answer.outcome


def test_two_requests_racing_for_the_rest_of_an_order_one_goes(seeded):
    order = Order.objects.get(order_id=ORDER)
    Ticket.objects.create(ticket_id="T-1050-2", order=order, subject="s", body="b")
    share = order.amount_cents * 6 // 10  # more than half each: both together exceed it
    first = refund_call("T-1050", share)
    second = refund_call("T-1050-2", share)

    outcomes = race(lambda: through_the_gate(*first), lambda: through_the_gate(*second))
    assert sorted(outcomes) == [operations.GO, operations.REFUSED], outcomes
    held = OperationExecution.objects.filter(state="held")
    assert held.count() == 1  # the refused call's slot went free again
    # the refusal said why, with the one in flight counted
    went = held.get().step_id
    refused = second[1] if went == first[1].id else first[1]
    over = refund_limit(refused.arguments)
    assert over is not None and over.figures["in_flight_cents"] == share
    assert "being refunded right now" in over.message


def test_a_refund_in_flight_counts_until_the_gateway_has_it(seeded):
    order = Order.objects.get(order_id=ORDER)
    Ticket.objects.create(ticket_id="T-1050-2", order=order, subject="s", body="b")
    run, step = refund_call("T-1050", 10_000)
    with transaction.atomic():
        assert operations.gate(run, step, get_tool("issue_refund"), first_attempt=True).go
    rest = {"order_id": ORDER, "ticket_id": "T-1050-2", "reason": "r"}
    left = order.amount_cents - 10_000
    assert refund_limit({**rest, "amount_cents": left}) is None
    assert refund_limit({**rest, "amount_cents": left + 1}).figures["in_flight_cents"] == 10_000
    # the gateway executed it (its key not settled yet): counted once, from the ledger
    GatewayRefund.objects.create(order_id=ORDER, amount_cents=10_000, idempotency_key="k-T-1050")
    over = refund_limit({**rest, "amount_cents": left + 1})
    assert over.figures["refunded_cents"] == 10_000 and "in_flight_cents" not in over.figures


def test_a_refund_in_flight_for_another_order_is_not_counted(seeded):
    # another order's refund holds its key right now; this order's whole amount still fits
    other = {"order_id": "ORD-1001", "ticket_id": "T-1001", "message": "refund"}
    run = start_run("refund", other, enqueue_task=False).run
    args = {"order_id": "ORD-1001", "ticket_id": "T-1001", "amount_cents": 500, "reason": "r"}
    step = Step.objects.create(
        run=run, index=1, kind=StepKind.TOOL, tool="issue_refund", arguments=args,
        idempotency_key="k-T-1001",
    )  # fmt: skip
    with transaction.atomic():
        assert operations.gate(run, step, get_tool("issue_refund"), first_attempt=True).go
    paid = Order.objects.get(order_id=ORDER).amount_cents
    call = {"order_id": ORDER, "ticket_id": "T-1050", "reason": "r"}
    assert refund_limit({**call, "amount_cents": paid}) is None
    assert "in_flight_cents" not in refund_limit({**call, "amount_cents": paid + 1}).figures


def test_a_ticket_of_another_order_is_refused(seeded):
    over = refund_limit(
        {"order_id": ORDER, "ticket_id": "T-1001", "amount_cents": 100, "reason": "r"}
    )
    assert over is not None
    assert over.message.startswith("ticket T-1001 is about order ORD-1001, not ORD-1050")
    missing = refund_limit({"order_id": ORDER, "ticket_id": "T-9", "amount_cents": 1})
    assert missing.message.startswith("ticket T-9 does not exist")


def test_a_refund_the_gateway_records_between_the_limits_reads_is_counted(seeded):
    """The gateway records a refund in flight (its key still held) while the limit is reading:
    the limit reads the keys in flight before the ledger, so the refund is counted in one of
    them, never in neither (read the other way round it was missed, and the second request
    could take money already paid out)."""
    order = Order.objects.get(order_id=ORDER)
    Ticket.objects.create(ticket_id="T-1050-2", order=order, subject="s", body="b")
    run, step = refund_call("T-1050", 10_000)
    with transaction.atomic():
        assert operations.gate(run, step, get_tool("issue_refund"), first_attempt=True).go
    left = order.amount_cents - 10_000
    recorded = []

    def gateway_records(sql: str) -> None:
        """From another connection, right after the limit's first read of a refund table."""
        if recorded or not ("support_gatewayrefund" in sql or "agentruns_step" in sql):
            return
        recorded.append(sql)
        race(
            lambda: GatewayRefund.objects.create(
                order_id=ORDER, amount_cents=10_000, idempotency_key="k-T-1050"
            )
        )

    def after(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        gateway_records(sql)
        return result

    with connection.execute_wrapper(after):
        over = refund_limit(
            {"order_id": ORDER, "ticket_id": "T-1050-2", "amount_cents": left + 1, "reason": "r"}
        )
    assert recorded, "the limit read no refund table"
    assert over is not None, "a refund recorded between the limit's reads was counted nowhere"
    assert over.figures["total_cents"] == order.amount_cents + 1
