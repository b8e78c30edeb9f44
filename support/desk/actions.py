"""What people do on the desk, one function each: log a customer's request from an outside
channel, and finish a hand-over on its ticket (refund by hand, reply, close).

A refund by hand goes through the refund agent's own `issue_refund`, never around it: it is a
run of the refund agent started by the person (`staff_refund` in its input, the offline
`scripted` model whatever AGENTRUNS_MODEL says, so it makes exactly the person's call), so it has
the same operation key (one refund per request), the same cap (the order's refunds up to what was
paid), the same approval rules (an approver decides it in the inbox; the two-person rule never
counts its starter) and the same audit (a run with its steps and events, started by that person).
The person's own tool policy is frozen into that run like any start: a trainee's run has no
`issue_refund`, and the desk does not offer it to them in the first place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from agentruns import services
from agentruns.runtime.access.permissions import snapshot
from agentruns.runtime.access.quotas import check_bucket
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.money import format_cents
from approvals import services as decisions
from approvals.domain import claims
from approvals.errors import AlreadyDecided, ClaimedByOther, DecisionError
from approvals.models import Approval
from support.ledger import order_refunds
from support.models import Order, OutboxMessage, Ticket

AGENT = "refund"
REFUND_TOOL = "issue_refund"
START = "agentruns.start_run"
ADD_TICKET = "support.add_ticket"
# a ticket from an outside channel: at most this many at once per sender, then this many a
# second (the same token bucket as run starts, a bucket of its own)
TICKETS_BURST = 20
TICKETS_PER_SECOND = 2.0
SUBJECT_MAX = Ticket._meta.get_field("subject").max_length
BODY_MAX = 5000  # what the refund agent's input takes as the customer's message
INTAKE_KEY_MAX = 200


class DeskRefused(Exception):
    """The desk cannot do this now (the reason says why): a 409 or a message on the page."""


def may_refund(user: Any) -> bool:
    """May `user` refund (start runs, and their groups' tool policy allows `issue_refund`)? The
    run's frozen snapshot decides again when the run starts."""
    if not getattr(user, "is_authenticated", False) or not user.has_perm(START):
        return False
    return bool(snapshot(user, [REFUND_TOOL])["tools"][REFUND_TOOL]["allowed"])


# ------------------------------------------------------------------ a request from outside
@dataclass
class Logged:
    ticket: Ticket
    created: bool  # False: a repeated Idempotency-Key found the sender's earlier ticket


def do_log_ticket(
    *, order_id: str, subject: str, body: str, user: Any, intake_key: str = ""
) -> Logged:
    """A customer's request from an outside channel (mail, a form, a phone call noted): a new
    ticket on the order, numbered after the order (`T-1050-2` is its second), searchable at once.
    `intake_key`: the sender's Idempotency-Key; the same key from the same sender returns the
    ticket it made. LookupError for an unknown order."""
    scoped = f"{getattr(user, 'pk', '')}:{intake_key}" if intake_key else None
    if scoped is not None:
        earlier = Ticket.objects.filter(intake_key=scoped).select_related("order").first()
        if earlier is not None:
            return Logged(earlier, created=False)
    check_bucket(
        "ticket", "tickets logged", user, burst=TICKETS_BURST, per_second=TICKETS_PER_SECOND
    )
    order = Order.objects.filter(order_id=order_id).first()
    if order is None:
        raise LookupError(f"no order {order_id}")
    digits = order.order_id.removeprefix("ORD-")
    count = order.tickets.count()
    for taken in range(20):  # the number is someone else's (a concurrent log): the next one
        number = count + 1 + taken
        ticket_id = f"T-{digits}" if number == 1 else f"T-{digits}-{number}"
        try:
            with transaction.atomic():
                ticket = Ticket.objects.create(
                    ticket_id=ticket_id[:20],
                    order=order,
                    subject=subject,
                    body=body,
                    created_by=user if getattr(user, "is_authenticated", False) else None,
                    intake_key=scoped,
                )
            return Logged(ticket, created=True)
        except IntegrityError:
            if scoped is not None:
                earlier = Ticket.objects.filter(intake_key=scoped).first()
                if earlier is not None:  # the same sender's retry won the race
                    return Logged(earlier, created=False)
    raise DeskRefused(f"could not number a new ticket for {order.order_id}: try again")


# ------------------------------------------------------------------ finishing a hand-over
def held_handover(ticket: Ticket, item: Approval | None, user: Any) -> Approval:
    """The ticket's pending hand-over, taken (or its claim renewed) by `user`: what every action
    on the hand-over requires (the inbox's claim, so the rights of a decision). DeskRefused
    when it is not open or someone else has it."""
    if item is None or item.status != "pending":
        raise DeskRefused(f"{ticket.ticket_id} has no open hand-over")
    try:
        return claims.claim(item.id, user=user)
    except ClaimedByOther as exc:
        raise DeskRefused(f"{exc.holder} has this hand-over") from None
    except AlreadyDecided as exc:
        raise DeskRefused(f"the hand-over was closed meanwhile: {exc}") from None
    except DecisionError as exc:
        raise PermissionDenied(str(exc)) from None


def do_refund_by_hand(
    ticket: Ticket, item: Approval | None, *, user: Any, amount_cents: int, reason: str, key: str
) -> services.StartResult:
    """Refund `amount_cents` on the hand-over's ticket through the refund agent's own tool
    (module docstring). `key`: the form's one-time token (a double click starts one run)."""
    if not may_refund(user):
        raise PermissionDenied(
            "your tool policy does not allow refunds: a colleague who may refund must do it"
        )
    held_handover(ticket, item, user)
    left = order_refunds(ticket.order).remaining_cents
    if amount_cents > left:  # (the tool's limit refuses it too: said here, before a run)
        raise DeskRefused(
            f"at most {format_cents(left, ticket.order.currency)} is left to refund on "
            f"{ticket.order.order_id}"
        )
    run_input = {
        "order_id": ticket.order.order_id,
        "ticket_id": ticket.ticket_id,
        "message": ticket.body or ticket.subject,
        "staff_refund": {"amount_cents": amount_cents, **({"reason": reason} if reason else {})},
    }
    return services.start_run(AGENT, run_input, dedupe_key=key, user=user, model="scripted")


def do_reply(
    ticket: Ticket, item: Approval | None, *, user: Any, text: str, key: str
) -> OutboxMessage:
    """A person's reply to the customer on the hand-over's ticket (once per form)."""
    held_handover(ticket, item, user)
    try:
        with transaction.atomic():
            return OutboxMessage.objects.create(
                order=ticket.order,
                ticket=ticket,
                to=ticket.order.customer_email,
                body=text,
                sent_by=actor_name(user) or "",
                idempotency_key=key,
            )
    except IntegrityError:  # this form was sent already: its reply, once
        return OutboxMessage.objects.get(idempotency_key=key)


def do_close(ticket: Ticket, item: Approval | None, *, user: Any, note: str) -> Approval:
    """Close the hand-over with what the person did (the inbox's one `decide`: who and when are
    recorded on the item and shown on the ticket)."""
    held_handover(ticket, item, user)
    return decisions.decide(item.id, "close", user, internal_note=note, door=decisions.Door.INBOX)
