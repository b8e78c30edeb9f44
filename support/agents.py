"""The demo's refund agent: a Pydantic AI agent, plugged in through the public registry only.

Its tools are Pydantic AI tools; what the engine must know about each (side effect,
idempotency, edit policy, approvals, redaction, retries, the argument bound to the run's order)
is its `metadata["agentruns"]`, built by `durable(...)`. A tool reads its step (the idempotency
key, the trace context) with `current_step()`. The agent has no model of its own:
`AGENTRUNS_MODEL` applies, offline the `scripted` model, which plays `refund_policy`
(support/policy/).
"""

from __future__ import annotations

import os
from typing import Annotated

import httpx
from django.db import IntegrityError, connection, transaction
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
from agentruns.registry.outcomes import HandoverClosed
from agentruns.registry.search import MAX_KEYS as SEARCH_MAX_KEYS
from agentruns.registry.search import register_search_expansion
from agentruns.runtime.values.timestamps import iso
from support.conf import demo_conf
from support.ledger import (
    order_refunds,
    refund_context,
    refund_limit,
    refund_operation_key,
    request_refund,
)
from support.models import Order, OutboxMessage, Ticket, TicketNote, TicketStatus
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
        "You are a support agent for an online shop. Each run answers one customer request (a "
        "ticket). Look up the order with its ticket: it says what was paid, what was refunded "
        "already and whether this request was refunded before. Refund what the customer is "
        "owed (the order amount unless they ask for less), never more than what is left of "
        "the order; if this request was already refunded, say when and how much instead of "
        "refunding again. Note what you did on the ticket and reply to the customer. If you "
        "refund less than they asked for, say so and why; if an approver changed the amount, "
        "pass on the approver's words for the customer. If a refund is rejected, tell the "
        "customer the reason you were given, if any. If the customer only asks a question, "
        "answer it or ask what they need; refund nothing. If you have no refund tool, hand the "
        "request over to a colleague with hand_over, tell the customer a colleague will take "
        "over and note the hand-over on the ticket."
    ),
)

TICKET_ID = Annotated[str, Field(pattern="^T-[A-Za-z0-9-]{1,18}$")]


# what a tool reads of the request and its order, written out: every lookup, note and reply asks
# it, and building the ORM's join costs the worker four times the statement's round trip
_ORDER_COLUMNS = (
    "id", "order_id", "customer_name", "customer_email", "amount_cents", "currency", "item", "status"
)  # fmt: skip
_TICKET_COLUMNS = ("id", "ticket_id", "order_id", "subject", "status")
_REQUEST_SQL = (
    f"SELECT {', '.join(f't.{c}' for c in _TICKET_COLUMNS)}, "
    f"{', '.join(f'o.{c}' for c in _ORDER_COLUMNS)} "
    "FROM support_ticket t JOIN support_order o ON o.id = t.order_id "
    "WHERE o.order_id = %s AND {which} ORDER BY t.id LIMIT 1"
)
_NAMED_REQUEST_SQL = _REQUEST_SQL.format(which="t.ticket_id = %s")
_OPEN_REQUEST_SQL = _REQUEST_SQL.format(which="t.status = %s")


def _named_or_open(order_id: str, ticket_id: str | None) -> tuple[Order, Ticket] | None:
    """Of the order's tickets, the request a call names: `ticket_id` (None when it is not one
    of them), else the oldest open one; with its order, in one statement. The models hold the
    columns above (any other field is read when asked for)."""
    sql = _NAMED_REQUEST_SQL if ticket_id else _OPEN_REQUEST_SQL
    with connection.cursor() as cursor:
        cursor.execute(sql, [order_id, ticket_id or TicketStatus.OPEN.value])
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(_TICKET_COLUMNS)
    order = Order.from_db(connection.alias, _ORDER_COLUMNS, row[split:])
    ticket = Ticket.from_db(connection.alias, _TICKET_COLUMNS, row[:split])
    ticket.order = order
    return order, ticket


def _latest_or_new(order: Order) -> Ticket:
    """The order's latest ticket, else one made for it (`T-<order_id>`, once)."""
    found = order.tickets.order_by("id").last()
    if found is None:
        found, _ = Ticket.objects.get_or_create(
            ticket_id=f"T-{order.order_id}"[:20],
            defaults={"order": order, "subject": "Refund request", "body": ""},
        )
    return found


def request_ticket(order: Order, ticket_id: str | None = None) -> Ticket | None:
    """The customer request a run answers: `ticket_id` when it is one of the order's tickets
    (None when it is not), else the order's open ticket, else its latest, else a ticket made for
    the order (`T-<order_id>`, once: the same one every time it is asked)."""
    found = _named_or_open(order.order_id, ticket_id)
    if found is not None:
        return found[1]
    return None if ticket_id else _latest_or_new(order)


def request_of(order_id: str, ticket_id: str | None) -> tuple[Order | None, Ticket | None]:
    """The order and the request a call names (`request_ticket`'s rule), in one query when the
    ticket is named, or the order has an open one: a tool of the demo agent asks it each call."""
    found = _named_or_open(order_id, ticket_id)
    if found is not None:
        return found
    order = Order.objects.filter(order_id=order_id).first()
    if order is None or ticket_id:
        return order, None  # no such order, or the ticket named is not one of its requests
    return order, _latest_or_new(order)


@refund_agent.tool_plain(metadata=durable(redact=("customer_email",), scope_arg="order_id"))
def lookup_order(order_id: str, ticket_id: str | None = None) -> dict:
    """Look up an order and the customer's request (its ticket; default: the order's open
    ticket): customer, amount, currency, item, status; the order's refunds so far, what is left
    to refund, and the refund this request already had, if any."""
    order, ticket = request_of(order_id, ticket_id)
    if order is None:
        return {"found": False, "order_id": order_id}
    if ticket is None:
        return {
            "found": False,
            "order_id": order_id,
            "error": f"ticket {ticket_id} is not a request about order {order_id}",
        }
    refunds = order_refunds(order)
    earlier = request_refund(ticket.ticket_id)
    return {
        "found": True,
        "order_id": order.order_id,
        "customer_name": order.customer_name,
        "customer_email": order.customer_email,
        "amount_cents": order.amount_cents,
        "currency": order.currency,
        "item": order.item,
        "status": order.status,
        "ticket_id": ticket.ticket_id,
        "refunds": refunds.as_json(),
        "refunded_cents": refunds.refunded_cents,
        "remaining_cents": refunds.remaining_cents,
        # this request was paid already (its operation key is used): refunding again pays nothing
        "request_refunded": None
        if earlier is None
        else {
            "amount_cents": earlier.amount_cents,
            "refund_id": earlier.refund_id,
            "at": iso(earlier.at),
            "run_id": earlier.run_id,
        },
    }


@refund_agent.tool_plain(
    metadata=durable(
        side_effect=True,
        idempotency="key",
        requires_approval=needs_refund_approval,
        approvals_required=refund_approvers,
        # approvers may lower the amount, never raise it or change the order or the request
        editable={"amount_cents": Edit.at_most_requested(minimum=1), "reason": Edit.free()},
        amount_arg="amount_cents",
        label="refund",  # "Waiting for an approver: refund 327.32 USD to Jun Sato"
        retry=RetryPolicy(max_attempts=3, backoff_seconds=0.5, backoff_max_seconds=5),
        # across runs (support/ledger.py): one refund per customer request, its ticket,
        # whichever run asks (a later call is told it was already done), an order's refunds
        # adding up to at most what was paid, and the order's refunds beside the call
        operation_key=refund_operation_key,
        limit=refund_limit,
        context=refund_context,
        # only the run's own order, whatever the thread's history or the customer's text names
        scope_arg="order_id",
    )
)
def issue_refund(
    order_id: Annotated[str, Field(pattern="^ORD-[0-9]+$")],
    ticket_id: TICKET_ID,
    amount_cents: Annotated[int, Field(ge=1, le=10_000_000)],
    reason: Annotated[str, Field(max_length=500)],
) -> dict:
    """Refund an order for one customer request (its ticket) through the payment gateway. Sends
    the step's idempotency key. When an approver changed the call, the result says what was
    asked (`requested_cents`) and the approver's words for the customer (`approver_reason`)."""
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
    result = {
        "refund_id": body["id"],
        "amount_cents": body["amount_cents"],
        "order_id": order_id,
        "ticket_id": ticket_id,
    }
    return result | review_of(getattr(ctx, "approval", None))


def review_of(approval: dict | None) -> dict:
    """What the customer may hear of the approval that let the refund run: the amount the
    agent asked for when an approver lowered it, and the approver's words for the customer."""
    if not approval:
        return {}
    review: dict = {}
    asked = (approval.get("requested") or {}).get("amount_cents")
    made = (approval.get("approved") or {}).get("amount_cents")
    if isinstance(asked, int) and isinstance(made, int) and made != asked:
        review["requested_cents"] = asked
    reason = str(approval.get("reason") or "").strip()
    if reason:
        review["approver_reason"] = reason
    return review


def _ticket_for(order_id: str, ticket_id: str | None) -> Ticket:
    order, ticket = request_of(order_id, ticket_id)
    if order is None:
        raise FatalToolError(f"no order {order_id}")
    if ticket is None:
        raise FatalToolError(f"ticket {ticket_id} is not a request about order {order_id}")
    return ticket


@refund_agent.tool_plain(
    metadata=durable(side_effect=True, idempotency="key", scope_arg="order_id")
)
def add_ticket_note(order_id: str, note: str, ticket_id: str | None = None) -> dict:
    """Add an internal note to the customer's request (its ticket; default: the order's open
    ticket)."""
    ctx = current_step()
    ticket = _ticket_for(order_id, ticket_id)
    try:
        with transaction.atomic():
            row = TicketNote.objects.create(
                ticket=ticket, body=note, idempotency_key=ctx.idempotency_key
            )
    except IntegrityError:  # this step already wrote it before a crash: same note, once
        row = TicketNote.objects.get(idempotency_key=ctx.idempotency_key)
    return {"ticket_id": ticket.ticket_id, "note_id": row.pk}


def resolve_handed_over_ticket(closed: HandoverClosed) -> None:
    """A person closed a hand-over of this agent's: its request (the ticket the call or the
    run's input names, else the order's open ticket, as when it handed over) is resolved by
    them, in the transaction that closes it. No such ticket (gone, or none of the order's is
    open any more): nothing to resolve."""
    order_id = closed.arguments.get("order_id") or closed.run_input.get("order_id")
    named = closed.arguments.get("ticket_id") or closed.run_input.get("ticket_id")
    # JSON of the call or the input: compared by text, as the columns hold them
    found = _named_or_open(str(order_id), str(named) if named else None) if order_id else None
    if found is not None:
        found[1].resolve(by=closed.closed_by, at=closed.closed_at)


@refund_agent.tool_plain(
    metadata=durable(
        handover=True,
        handover_closed=resolve_handed_over_ticket,
        context=refund_context,
        scope_arg="order_id",
    )
)
def hand_over(order_id: str, reason: str, ticket_id: str | None = None) -> dict:
    """Hand the customer's request over to a colleague when you may not do what it needs (you
    have no refund tool): a person picks it up in the inbox, with the order and the request's
    ticket beside it."""
    return {"handed_over": True, "order_id": order_id, "ticket_id": ticket_id, "reason": reason}


@refund_agent.tool_plain(
    metadata=durable(side_effect=True, idempotency="none", scope_arg="order_id")
)
def send_customer_reply(order_id: str, message: str, ticket_id: str | None = None) -> dict:
    """Send a reply to the customer by email, on their request (its ticket; default: the
    order's open ticket). Not idempotent: an interrupted send is unknown."""
    ctx = current_step()
    ticket = _ticket_for(order_id, ticket_id)
    row = OutboxMessage.objects.create(
        order=ticket.order,
        ticket=ticket,
        to=ticket.order.customer_email,
        body=message,
        run_id=ctx.run.id,
        step_id=ctx.step.id,
    )
    return {"outbox_id": row.pk, "to": "customer"}


@register_search_expansion
def desk_search_keys(q: str) -> list[str]:
    """What a search text stands for in the desk, as the orders whose runs it finds (a run's
    search keys are its order and ticket), newest first: the runs list, the API's `q` and the
    inbox's decided view find runs by what support staff type.

    - an order's or a ticket's number, digits alone ("1050", "#1050"): that order, and the
      order of the ticket with that number (index lookups);
    - words ("yoga", "Jun Sato", "arrived broken"): the orders whose customer's name has them,
      and the orders of the tickets whose words have them (the customer's message, the subject,
      the customer's name and email: the ticket search's one trigram index)."""
    text = q.strip().lstrip("#")
    if text.isdigit():
        orders = set(
            Order.objects.filter(order_id=f"ORD-{text}").values_list("order_id", flat=True)
        )
        orders |= set(
            Ticket.objects.filter(ticket_id__in=[f"T-{text}", f"T-ORD-{text}"]).values_list(
                "order__order_id", flat=True
            )
        )
        return sorted(orders)
    if len(text) < 2 or any(c.isdigit() for c in text):  # a key, an amount: no words of people
        return []
    named = Order.objects.filter(customer_name__icontains=text).order_by("-id")
    keys = list(named.values_list("order_id", flat=True)[:SEARCH_MAX_KEYS])
    # their words too (the trigram index needs three characters), unless the customers' names
    # alone fill the search (a common name: its newest orders)
    if len(text) >= 3 and len(keys) < SEARCH_MAX_KEYS:
        said = (
            Ticket.objects.filter(search_text__icontains=text)
            .order_by("-created_at", "-id")
            .values_list("order__order_id", flat=True)
        )
        keys += list(said[:SEARCH_MAX_KEYS])
    return list(dict.fromkeys(keys))[:SEARCH_MAX_KEYS]


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
            # a person refunds by hand through the agent's own refund tool (the desk's ticket
            # page, on a hand-over): this amount, with these words for the customer
            "staff_refund": {
                "type": "object",
                "properties": {
                    "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
                    "reason": {"type": "string", "maxLength": 500},
                },
                "required": ["amount_cents"],
                "additionalProperties": False,
            },
        },
        "required": ["order_id"],
        "additionalProperties": False,  # an unknown key is a mistake, or a payload
    },
    # a run is about its order: every tool's order_id must be it (a thread's earlier messages
    # or the customer's text naming another order never widen that)
    scope=lambda run_input: run_input["order_id"],
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
