"""The demo's refund agent: a Pydantic AI agent, plugged in through the public registry only.

Its four tools are Pydantic AI tools; what the engine must know about each (side effect,
idempotency, edit policy, approvals, redaction, retries) is its `metadata["agentruns"]`, built by
`durable(...)`. A tool reads its step (the idempotency key, the trace context) with
`current_step()`. The agent has no model of its own: `AGENTRUNS_MODEL` applies, offline the
`scripted` model, which plays `refund_policy` (support/policy.py).
"""

from __future__ import annotations

import os
from typing import Annotated

import httpx
from django.db import IntegrityError, transaction
from pydantic import Field
from pydantic_ai import Agent

from agentruns.registry import (
    Edit,
    FatalToolError,
    RetryableToolError,
    RetryPolicy,
    current_step,
    durable,
    register_agent,
)
from agentruns.registry.search import MAX_KEYS as SEARCH_MAX_KEYS
from agentruns.registry.search import register_search_expansion
from support.conf import demo_conf
from support.ledger import refund_context, refund_limit, refund_operation_key
from support.models import Order, OutboxMessage, Ticket, TicketNote
from support.outcomes import REFUND_OUTCOMES, refund_outcome
from support.policy import refund_policy

_client: tuple[int, httpx.Client] | None = None


def gateway_client() -> httpx.Client:
    """One keep-alive client per process (q2 forks workers, so never share across a fork)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), httpx.Client(timeout=demo_conf.GATEWAY_TIMEOUT_SECONDS))
    return _client[1]


def _two_person(amount_cents: int) -> bool:
    limit = demo_conf.TWO_PERSON_CENTS
    return limit > 0 and amount_cents > limit


def gateway_headers(idempotency_key: str, traceparent: str = "") -> dict[str, str]:
    headers = {"Idempotency-Key": idempotency_key}
    if traceparent:  # the run's trace context: the provider's logs name the run's trace
        headers["traceparent"] = traceparent
    if demo_conf.GATEWAY_KEY:
        headers["Authorization"] = f"Bearer {demo_conf.GATEWAY_KEY}"
    return headers


def needs_refund_approval(arguments: dict) -> bool:
    amount = int(arguments.get("amount_cents", 0))
    return amount > demo_conf.APPROVAL_THRESHOLD_CENTS or _two_person(amount)


def refund_approvers(arguments: dict) -> int:
    """REFUND_TWO_PERSON_CENTS: refunds above it need two approvers (neither the starter)."""
    return 2 if _two_person(int(arguments.get("amount_cents", 0))) else 1


refund_agent = Agent(
    name="refund",
    instructions=(
        "You are a support agent for an online shop. Look up the order, refund the amount "
        "the customer is owed (the order amount unless they ask for less), note it on the "
        "ticket and reply to the customer. If you refund less than the order's amount, say so "
        "and why. If a refund is rejected, tell the customer the reason you were given, if any. "
        "If you have no refund tool, hand the request over to a colleague with hand_over, tell "
        "the customer a colleague will take over and note the hand-over on the ticket."
    ),
)


@refund_agent.tool_plain(metadata=durable(redact=("customer_email",)))
def lookup_order(order_id: str) -> dict:
    """Look up an order: customer, amount, currency, item and status."""
    order = Order.objects.filter(order_id=order_id).first()
    if order is None:
        return {"found": False, "order_id": order_id}
    ticket = order.tickets.filter(status="open").order_by("id").first()
    return {
        "found": True,
        "order_id": order.order_id,
        "customer_name": order.customer_name,
        "customer_email": order.customer_email,
        "amount_cents": order.amount_cents,
        "currency": order.currency,
        "item": order.item,
        "status": order.status,
        "ticket_id": ticket.ticket_id if ticket else None,
    }


@refund_agent.tool_plain(
    metadata=durable(
        side_effect=True,
        idempotency="key",
        requires_approval=needs_refund_approval,
        approvals_required=refund_approvers,
        # approvers may lower the amount, never raise it or change the order
        editable={"amount_cents": Edit.at_most_requested(minimum=1), "reason": Edit.free()},
        amount_arg="amount_cents",
        label="refund",  # "Waiting for an approver: refund 327.32 USD to Jun Sato"
        retry=RetryPolicy(max_attempts=3, backoff_seconds=0.5, backoff_max_seconds=5),
        # across runs (support/ledger.py): one refund per order whichever run asks (a second
        # run is told it was already done), refunds adding up to at most what was paid, and
        # the order's refunds beside the call in the inbox
        operation_key=refund_operation_key,
        limit=refund_limit,
        context=refund_context,
    )
)
def issue_refund(
    order_id: Annotated[str, Field(pattern="^ORD-[0-9]+$")],
    amount_cents: Annotated[int, Field(ge=1, le=10_000_000)],
    reason: Annotated[str, Field(max_length=500)],
) -> dict:
    """Refund an order through the payment gateway. Sends the step's idempotency key."""
    ctx = current_step()
    url = demo_conf.GATEWAY_URL.rstrip("/") + "/refunds"
    try:
        response = gateway_client().post(
            url,
            json={"order_id": order_id, "amount_cents": amount_cents, "reason": reason},
            headers=gateway_headers(ctx.idempotency_key, ctx.traceparent),
        )
    except httpx.HTTPError as exc:
        raise RetryableToolError(f"gateway unreachable: {exc}") from exc
    if response.status_code >= 500 or response.status_code == 429:
        raise RetryableToolError(f"gateway answered {response.status_code}")
    if response.status_code >= 400:
        raise FatalToolError(f"gateway refused: {response.status_code} {response.text[:300]}")
    body = response.json()
    return {"refund_id": body["id"], "amount_cents": body["amount_cents"], "order_id": order_id}


def _ticket_for(order_id: str) -> Ticket:
    order = Order.objects.filter(order_id=order_id).first()
    if order is None:
        raise FatalToolError(f"no order {order_id}")
    ticket = order.tickets.filter(status="open").order_by("id").first()
    if ticket is None:
        ticket = Ticket.objects.create(
            ticket_id=f"T-{order.order_id}", order=order, subject="Refund request", body=""
        )
    return ticket


@refund_agent.tool_plain(metadata=durable(side_effect=True, idempotency="key"))
def add_ticket_note(order_id: str, note: str) -> dict:
    """Add an internal note to the order's open support ticket."""
    ctx = current_step()
    ticket = _ticket_for(order_id)
    try:
        with transaction.atomic():
            row = TicketNote.objects.create(
                ticket=ticket, body=note, idempotency_key=ctx.idempotency_key
            )
    except IntegrityError:  # this step already wrote it before a crash: same note, once
        row = TicketNote.objects.get(idempotency_key=ctx.idempotency_key)
    return {"ticket_id": ticket.ticket_id, "note_id": row.pk}


@refund_agent.tool_plain(metadata=durable(handover=True, context=refund_context))
def hand_over(order_id: str, reason: str) -> dict:
    """Hand the customer's request over to a colleague when you may not do what it needs (you
    have no refund tool): a person picks it up in the inbox, with the order beside it."""
    return {"handed_over": True, "order_id": order_id, "reason": reason}


@refund_agent.tool_plain(metadata=durable(side_effect=True, idempotency="none"))
def send_customer_reply(order_id: str, message: str) -> dict:
    """Send a reply to the customer by email (not idempotent: an interrupted send is unknown)."""
    ctx = current_step()
    order = Order.objects.filter(order_id=order_id).first()
    if order is None:
        raise FatalToolError(f"no order {order_id}")
    row = OutboxMessage.objects.create(
        order=order, to=order.customer_email, body=message, run_id=ctx.run.id, step_id=ctx.step.id
    )
    return {"outbox_id": row.pk, "to": "customer"}


@register_search_expansion
def customers_orders(q: str) -> list[str]:
    """A customer's name (or part of it) stands for their orders, newest first: the runs list and
    the inbox's decided view find their runs (a run's search keys are its order and ticket)."""
    if len(q) < 2 or any(c.isdigit() for c in q):  # an id, an amount: no customer's name
        return []
    orders = Order.objects.filter(customer_name__icontains=q).order_by("-id")
    return list(orders.values_list("order_id", flat=True)[:SEARCH_MAX_KEYS])


register_agent(
    refund_agent,
    scripted_policy=refund_policy,
    # what a run's work came to, beside its status (refunded, refund rejected, handed over...)
    outcome=refund_outcome,
    outcomes=REFUND_OUTCOMES,
    # the model reads the whole input (order, ticket, message) as JSON, not only the message
    format_input=None,
    search_fields=("order_id", "ticket_id"),
    # what the customer reads: the run page shows it as the reply sent
    replies={"send_customer_reply": "message"},
    input_schema={
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "minLength": 1, "maxLength": 20},
            "message": {"type": "string", "maxLength": 5000},
            "ticket_id": {"type": "string", "maxLength": 50},
        },
        "required": ["order_id"],
        "additionalProperties": False,  # an unknown key is a mistake, or a payload
    },
    # REFUND_RUNS_PER_ORDER runs per order at a time (default one): a second ticket on the order
    # waits behind the first (which keeps its place while it waits for an approver), then sees
    # what the first one did; 0: no line (operation keys alone keep the refund single)
    **(
        {
            "concurrency_key": lambda run_input: run_input["order_id"],
            "concurrency": demo_conf.RUNS_PER_ORDER,
        }
        if demo_conf.RUNS_PER_ORDER
        else {}
    ),
)
