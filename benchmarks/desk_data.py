"""The support desk's data at scale for `benchmarks.desk_pages`: orders and tickets (customers,
items, what they wrote), runs of the refund agent on them with steps, events, attempts, inbox
items (pending and decided, with each person's decision), notes, replies and gateway refunds.
Bulk-inserted, deterministic (one seed), history spread over 60 days."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from typing import Any

FIRST = "Ada Ben Chloe Dev Elena Farah Gus Hana Ivan Jun Kofi Lena Mateo Nia Omar Priya Quinn Rosa Sven Tara".split()
LAST = (
    "Lovelace Okafor Martin Patel Rossi Haddad Berg Sato Petrov Kim Nguyen Silva Novak Dubois "
    "Larsen Moreau Tanaka Kowalski Ahmed Schmidt Garcia Murphy Cohen Ivanova Mensah"
).split()
ITEMS = "blender lamp jacket headphones grinder backpack shoes kettle stand mat".split()
COMPLAINTS = [
    "arrived broken",
    "never arrived",
    "is not what I ordered",
    "stopped working after a week",
    "was charged twice",
]
RUN_STATUSES = (
    ["succeeded"] * 70
    + ["failed"] * 10
    + ["waiting"] * 8
    + ["cancelled"] * 10
    + [
        "running",
        "queued",
    ]
)
BATCH = 5_000


def _spread(rng: random.Random, now: Any) -> Any:
    return now - timedelta(seconds=rng.uniform(0, 60 * 86400))


def insert_desk(tickets: int, runs: int, seed: int = 34) -> dict[str, Any]:
    """Insert `tickets` orders with a ticket each and `runs` refund runs on them; what the
    timed pages need to name (a ticket with runs, a run with an approval, a customer)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from agentruns.models import Run, RunEvent, Step, StepAttempt
    from approvals.models import Approval, ApprovalDecision
    from support.models import GatewayRefund, Order, OutboxMessage, Ticket, ticket_search_text

    rng = random.Random(seed)
    now = timezone.now()
    users = {
        name: get_user_model().objects.create_user(name, password=f"bench-{name}-pw-1")
        for name in ("approver", "approver2")
    }
    lead = get_user_model().objects.create_superuser("lead", password="bench-lead-pw-1")
    for model in (Order, Ticket, Run, Step, RunEvent, Approval):
        for name in ("created_at",):
            model._meta.get_field(name).auto_now_add = False

    orders: list[Order] = []
    for first in range(0, tickets, BATCH):
        batch_orders, batch_tickets = [], []
        for n in range(first, min(first + BATCH, tickets)):
            name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            item, complaint = rng.choice(ITEMS), rng.choice(COMPLAINTS)
            created = _spread(rng, now)
            order = Order(
                order_id=f"ORD-{10001 + n}",
                customer_name=name,
                customer_email=f"{name.replace(' ', '.').lower()}{n}@example.com",
                amount_cents=rng.randint(2000, 40000),
                item=item,
                created_at=created,
            )
            batch_orders.append(order)
            ticket = Ticket(
                ticket_id=f"T-{10001 + n}",
                order=order,
                subject=f"Order {order.order_id}: {item} {complaint}",
                body=f"Hello, my {item} {complaint}. Order {order.order_id}. Please refund.",
                status="open" if rng.random() < 0.8 else "resolved",
                created_at=created + timedelta(minutes=rng.uniform(1, 600)),
            )
            # (bulk_create skips save(), which writes the search words)
            ticket.search_text = ticket_search_text(
                ticket.ticket_id, order, ticket.subject, ticket.body
            )
            batch_tickets.append(ticket)
        Order.objects.bulk_create(batch_orders)
        Ticket.objects.bulk_create(batch_tickets)
        orders += batch_orders

    by_order: dict[str, list] = {}
    pending_left = 200
    for first in range(0, runs, BATCH):
        new_runs, steps, attempts, events, approvals, decisions = [], [], [], [], [], []
        replies, refunds = [], []
        for _ in range(first, min(first + BATCH, runs)):
            order = rng.choice(orders)
            ticket_id = "T-" + order.order_id[4:]
            status = rng.choice(RUN_STATUSES)
            created = order.created_at + timedelta(hours=rng.uniform(1, 48))
            run = Run(
                id=uuid.uuid4(),
                agent="refund",
                status=status,
                input={"order_id": order.order_id, "ticket_id": ticket_id, "message": "broken"},
                search_text=f"{order.order_id} {ticket_id}",  # the agent's search fields
                created_at=created,
                created_by=lead,
                step_count=4,
                error="step #3 issue_refund failed: gateway answered 503"
                if status == "failed"
                else "",
                output="Done: refunded." if status == "succeeded" else "",
            )
            new_runs.append(run)
            by_order.setdefault(order.order_id, []).append(run)
            for index, (kind, tool) in enumerate(
                [("model", ""), ("tool", "lookup_order"), ("model", ""), ("tool", "issue_refund")]
            ):
                step = Step(
                    id=uuid.uuid4(),
                    run=run,
                    index=index,
                    kind=kind,
                    tool=tool,
                    # what the demo agent's calls carry (support/agents.py): a refund names its
                    # request and says why, and the lookup answers the order's facts
                    arguments={
                        "order_id": order.order_id,
                        "ticket_id": ticket_id,
                        "amount_cents": order.amount_cents,
                        "reason": "The customer says the item arrived broken.",
                    }
                    if tool == "issue_refund"
                    else {"order_id": order.order_id},
                    result={
                        "found": True,
                        "order_id": order.order_id,
                        "customer_name": order.customer_name,
                        "amount_cents": order.amount_cents,
                        "currency": order.currency,
                        "ticket_id": ticket_id,
                    }
                    if tool == "lookup_order"
                    else None,
                    idempotency_key=uuid.uuid4().hex,
                    created_at=created,
                    status="succeeded",
                    attempts=1,
                    text="Let me look up the order." if kind == "model" else "",
                )
                steps.append(step)
                attempts.append(
                    StepAttempt(
                        step=step, number=1, worker="bench", started_at=created, outcome="succeeded"
                    )
                )
                if tool == "issue_refund" and status in ("succeeded", "waiting"):
                    approvals.append(
                        _approval(rng, run, step, order, created, users, decisions, status)
                    )
            events += [
                RunEvent(
                    run=run,
                    seq=seq,
                    type="run.status",
                    data={"status": "running"},
                    created_at=created,
                )
                for seq in range(1, 11)
            ]
            run.last_seq = 10
            if status == "succeeded":
                refunds.append(
                    GatewayRefund(
                        order_id=order.order_id,
                        amount_cents=order.amount_cents,
                        idempotency_key=uuid.uuid4().hex,
                    )
                )
                replies.append(
                    OutboxMessage(
                        order=order, to=order.customer_email, body="Refunded.", run_id=run.id
                    )
                )
        for approval in approvals:
            if approval.status == "pending" and pending_left <= 0:
                approval.status, approval.decided_at = "rejected", approval.created_at
            pending_left -= approval.status == "pending"
            # what the run came to (the runs list's outcome column and filter)
            if approval.run.status == "succeeded":
                rejected = approval.status == "rejected"
                approval.run.outcome = "refund_rejected" if rejected else "refunded"
        Run.objects.bulk_create(new_runs)
        Step.objects.bulk_create(steps)
        StepAttempt.objects.bulk_create(attempts)
        RunEvent.objects.bulk_create(events)
        Approval.objects.bulk_create(approvals)
        ApprovalDecision.objects.bulk_create(decisions)
        GatewayRefund.objects.bulk_create(refunds)
        OutboxMessage.objects.bulk_create(replies)

    busiest = max(by_order, key=lambda o: len(by_order[o]))
    approval = Approval.objects.filter(status="approved").order_by("-decided_at").first()
    return {
        "ticket": "T-" + busiest[4:],
        "order": busiest,
        "run": by_order[busiest][0].id,
        "approval": approval.id if approval else None,
        "customer": orders[len(orders) // 2].customer_name.split()[1],
    }


def _approval(rng, run, step, order, created, users, decisions, status):
    from approvals.models import Approval, ApprovalDecision

    who = users[rng.choice(list(users))]
    pending = status == "waiting"
    decided_at = None if pending else created + timedelta(minutes=rng.uniform(1, 240))
    verdict = "approved" if rng.random() < 0.85 else "rejected"
    approval = Approval(
        step=step,
        run=run,
        agent="refund",
        tool="issue_refund",
        requested_args=step.arguments,
        status="pending" if pending else verdict,
        decided_by=None if pending else who,
        decided_at=decided_at,
        reason="" if verdict == "approved" else "not covered",
        internal_note="" if verdict == "approved" else "second claim this month",
        created_at=created,
        approvals_given=0 if pending else 1,
    )
    if not pending:
        decisions.append(
            ApprovalDecision(
                approval=approval,
                user=who,
                username=who.username,
                decision="approve" if verdict == "approved" else "reject",
                round=1,
                args=step.arguments,
                reason=approval.reason,
                internal_note=approval.internal_note,
                decided_at=decided_at,
            )
        )
    return approval
