"""Reads for the support desk's pages: the ticket queue and one ticket with its order.

The queue is keyset-paginated with the app's one pagination helper (newest first, one indexed
range scan per page at any table size); a ticket page costs a fixed number of queries: the
ticket with its order, the conversation (notes, replies, the request's hand-over), the gateway's
refunds of the order (each with the request it paid), the request's own refund, and the runs on
it (the runtime's own run search, by the order's id as a whole search key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from agentruns.models import Run
from agentruns.runtime.values.money import format_cents, major_text
from agentruns.runtime.values.timestamps import moment_text
from agentruns.selectors import RunFilters, run_page
from agentruns.selectors.pagination import KeysetPage, keyset_page
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from support.ledger import RequestRefund, order_refunds, request_refund
from support.models import OutboxMessage, Ticket, TicketNote, TicketStatus

PAGE_SIZE = 25
# the queue's choices: open (the default: what needs someone), resolved (finished by a person,
# who closed its hand-over), or every ticket
STATUSES = {
    TicketStatus.OPEN: "open tickets",
    TicketStatus.RESOLVED: "resolved tickets",
    "any": "every ticket",
}
SEARCH_MAX = 100
# a ticket page lists at most this many of each (notes, replies, refunds, runs), newest kept
TICKET_PAGE_ROWS = 100
ACTIVE_RUN_STATUSES = ("queued", "running", "waiting")


@dataclass(frozen=True)
class TicketFilters:
    status: str = "open"
    q: str = ""

    @classmethod
    def from_query(cls, params: Any) -> TicketFilters:
        status = params.get("status", "open")
        return cls(
            status=status if status in STATUSES else "open",
            q=params.get("q", "").strip()[:SEARCH_MAX],
        )

    def as_params(self) -> dict[str, str]:
        params = {"q": self.q} if self.q else {}
        if self.status != "open":
            params["status"] = self.status
        return params

    @property
    def active(self) -> bool:
        return bool(self.q) or self.status != "open"


def ticket_search(q: str) -> Q:
    """An order or ticket key, a customer's name or email, or words of the ticket's subject or
    message, anywhere in the ticket's search words (`Ticket.search_text`), any case: one trigram
    index serves it (migration 0004), and the database picks between reading the few matches
    and walking the date index past the many."""
    return Q(search_text__icontains=q)


def ticket_rows(filters: TicketFilters) -> QuerySet[Ticket]:
    # (who resolved a ticket: its chip names them)
    tickets = Ticket.objects.select_related("order", "resolved_by").defer(
        "search_text", "order__customer_email"
    )
    if filters.status != "any":
        tickets = tickets.filter(status=filters.status)
    if filters.q:
        tickets = tickets.filter(ticket_search(filters.q))
    return tickets


def ticket_queue(filters: TicketFilters, *, older: str = "", newer: str = "") -> KeysetPage:
    """One page of tickets, newest first (`keyset_page` on (created_at, id))."""
    return keyset_page(ticket_rows(filters), older=older, newer=newer, size=PAGE_SIZE)


@dataclass
class Refund:
    refund_id: str
    amount: str
    reason: str
    created_at: datetime
    ticket_id: str | None = None  # the request it paid, when known


@dataclass
class Message:
    """One entry of a ticket's conversation: the customer's words, a reply sent, a note, or what
    a person did with the request's hand-over."""

    kind: str  # "customer" | "reply" | "note" | "handover"
    who: str
    text: str
    at: datetime
    run_id: Any = None  # the run that wrote it, when one did


@dataclass
class Handover:
    """The request's hand-over to a person (the inbox item a run opened when it could not do
    what the customer needs): where it stands, who has it, and who closed it with what note."""

    item: Approval
    why: str  # what the agent said when it handed over

    @property
    def pending(self) -> bool:
        return self.item.status == ApprovalStatus.PENDING

    @property
    def holder(self) -> Any:
        return self.item.claimant()

    @property
    def closed_by(self) -> str:
        return self.item.decided_by_name or "" if not self.pending else ""


@dataclass
class TicketView:
    ticket: Ticket
    conversation: list[Message]
    refunds: list[Refund]
    refunded: str  # the total, in the order's currency
    refundable: str  # what is left of the order's amount
    fully_refunded: bool
    runs: list[Run]
    active_runs: list[Run] = field(default_factory=list)
    refundable_cents: int = 0
    # the request's hand-over, the newest (None: never handed over)
    handover: Handover | None = None
    # this request's refund when it was paid (its operation key used): asking again pays nothing
    request_refund: RequestRefund | None = None

    @property
    def order(self):
        return self.ticket.order

    @property
    def amount(self) -> str:
        return format_cents(self.order.amount_cents, self.order.currency)

    @property
    def refundable_major(self) -> str:
        """What is left, as typed in the refund form ("227.32")."""
        return major_text(self.refundable_cents)

    @property
    def request_refunded(self) -> str:
        """This request's refund in words ("100.00 USD on Dec 6, 09:14"), "" when none."""
        paid = self.request_refund
        if paid is None:
            return ""
        amount = (
            format_cents(paid.amount_cents, self.order.currency)
            if paid.amount_cents is not None
            else "a refund"
        )
        when = moment_text(paid.at)
        return f"{amount} on {when}" if when else amount

    @property
    def state(self) -> str:
        """Where the request stands, in words (beside its status)."""
        handover = self.handover
        if handover is None:
            return ""
        if handover.pending:
            holder = handover.holder
            taken = f"taken by {holder.get_username()}" if holder else "waiting for a colleague"
            return f"handed over: {taken}"
        if handover.item.resolution == "withdrawn":
            return "hand-over withdrawn"
        return f"hand-over closed by {handover.closed_by or 'the system'}"


def ticket_view(ticket: Ticket) -> TicketView:
    order = ticket.order
    notes = list(
        TicketNote.objects.filter(ticket=ticket).order_by("-created_at")[:TICKET_PAGE_ROWS]
    )
    # the request's own replies, and the order's from before replies named their ticket
    replies = list(
        OutboxMessage.objects.filter(Q(ticket=ticket) | Q(ticket__isnull=True, order=order))
        .only("body", "created_at", "run_id", "sent_by")
        .order_by("-created_at")[:TICKET_PAGE_ROWS]
    )
    runs = ticket_runs(ticket)
    handover = ticket_handover(ticket, runs)
    conversation = [
        Message("customer", order.customer_name, ticket.body or ticket.subject, ticket.created_at),
        *(
            Message("reply", r.sent_by or "reply sent", r.body, r.created_at, r.run_id)
            for r in replies
        ),
        *(Message("note", n.author or "internal note", n.body, n.created_at) for n in notes),
        *handover_messages(handover),
    ]
    conversation.sort(key=lambda m: m.at)
    refunds = order_refunds(order, limit=TICKET_PAGE_ROWS)
    left = refunds.remaining_cents
    return TicketView(
        ticket=ticket,
        conversation=conversation,
        refunds=[
            Refund(
                r.refund_id,
                format_cents(r.amount_cents, order.currency),
                r.reason,
                r.at,
                r.ticket_id,
            )
            for r in refunds.refunds
        ],
        refunded=format_cents(refunds.refunded_cents, order.currency),
        refundable=format_cents(left, order.currency),
        fully_refunded=refunds.refunded_cents >= order.amount_cents,
        runs=runs,
        active_runs=[r for r in runs if r.status in ACTIVE_RUN_STATUSES],
        refundable_cents=left,
        handover=handover,
        request_refund=request_refund(ticket.ticket_id),
    )


def ticket_handover(ticket: Ticket, runs: list[Run]) -> Handover | None:
    """The newest hand-over of the runs on the ticket's order that is about this ticket (its
    call names the ticket, or its run's input does; one naming none is the order's open
    request's). One query, by the runs' ids."""
    items = (
        Approval.objects.filter(kind=ApprovalKind.HANDOVER, run_id__in=[r.id for r in runs])
        .select_related("run", "step", "claimed_by", "decided_by")
        .order_by("-created_at", "-id")
    )
    for item in items:
        named = item.requested_args.get("ticket_id") or (item.run.input or {}).get("ticket_id")
        if named in (ticket.ticket_id, None):
            return Handover(item, str(item.requested_args.get("reason") or ""))
    return None


def handover_messages(handover: Handover | None) -> list[Message]:
    """The hand-over in the conversation: the agent handing over, and a person closing it."""
    if handover is None:
        return []
    item = handover.item
    said = [
        Message(
            "handover", "the agent", f"handed over: {handover.why}", item.created_at, item.run_id
        )
    ]
    if not handover.pending and item.decided_at is not None:
        if item.resolution == "withdrawn":
            text = "the hand-over was withdrawn"
        else:
            text = "closed the hand-over"
            words = "; ".join(w for w in (item.internal_note, item.reason) if w)
            text += f": {words}" if words else ""
        said.append(
            Message("handover", item.decided_by_name or "the system", text, item.decided_at)
        )
    return said


def ticket_runs(ticket: Ticket) -> list[Run]:
    """Every run on the ticket's order (whichever door started it), newest first: the runtime's
    run search by the order's id as a whole search key (the refund agent's search fields)."""
    page = run_page(
        RunFilters(key=ticket.order.order_id),
        size=TICKET_PAGE_ROWS,
        fields=("created_by__username",),
    )
    return page.items
