"""support 0006 on data made before it: a ticket whose newest hand-over was closed is resolved
by whoever closed it (the ticket the hand-over named, or the order's open one); a ticket whose
newest hand-over is still waiting, or that was never handed over, stays open."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("support", "0005_short_search_pending_lists")
AFTER = ("support", "0006_ticket_resolved")


def migrate(support: tuple[str, str]):  # noqa: ANN201  (the state's apps)
    """Every app at its latest migration but support, at `support` (its hand-overs and runs
    are other apps' models)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    targets = [leaf for leaf in executor.loader.graph.leaf_nodes() if leaf[0] != "support"]
    executor.migrate([support])
    return executor.loader.project_state([*targets, support]).apps


def test_tickets_whose_hand_over_was_closed_are_resolved_by_who_closed_it():
    (latest,) = MigrationExecutor(connection).loader.graph.leaf_nodes("support")
    try:
        old = migrate(BEFORE)
        User = old.get_model(*settings.AUTH_USER_MODEL.split("."))
        Order, Ticket = old.get_model("support", "Order"), old.get_model("support", "Ticket")
        Run, Step = old.get_model("agentruns", "Run"), old.get_model("agentruns", "Step")
        Approval = old.get_model("approvals", "Approval")
        lead = User.objects.create(username="lead-0006")
        closed_at = timezone.now()

        def ticket(order_id: str, ticket_id: str):
            order = Order.objects.create(
                order_id=order_id, customer_name="Jun Sato", customer_email="j@x", amount_cents=1
            )
            return Ticket.objects.create(ticket_id=ticket_id, order=order, subject="s", body="b")

        def hand_over(args: dict, run_input: dict, *, closed: bool) -> None:
            run = Run.objects.create(agent="refund", input=run_input)
            step = Step.objects.create(
                run=run, index=1, kind="tool", tool="hand_over", idempotency_key=uuid.uuid4().hex
            )
            Approval.objects.create(
                step=step,
                run=run,
                kind="handover",
                status="resolved" if closed else "pending",
                resolution="closed" if closed else "",
                agent="refund",
                tool="hand_over",
                requested_args=args,
                decided_by=lead if closed else None,
                decided_at=closed_at if closed else None,
            )

        named = ticket("ORD-9001", "T-9001")
        by_order = ticket("ORD-9002", "T-9002")
        waiting = ticket("ORD-9003", "T-9003")
        never = ticket("ORD-9004", "T-9004")
        hand_over({"order_id": "ORD-9001", "ticket_id": "T-9001"}, {}, closed=True)
        hand_over({}, {"order_id": "ORD-9002"}, closed=True)
        hand_over({"order_id": "ORD-9003"}, {}, closed=True)
        hand_over({"order_id": "ORD-9003"}, {}, closed=False)  # the newest still waits

        new = migrate(AFTER)
        Ticket = new.get_model("support", "Ticket")
        rows = {t.pk: t for t in Ticket.objects.all()}
        for resolved in (named, by_order):
            row = rows[resolved.pk]
            assert (row.status, row.resolved_by_id, row.resolved_at) == (
                "resolved",
                lead.pk,
                closed_at,
            )
        for still_open in (waiting, never):
            assert (rows[still_open.pk].status, rows[still_open.pk].resolved_by_id) == (
                "open",
                None,
            )
    finally:
        migrate(latest)
