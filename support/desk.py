"""Reads for the support desk's pages: the ticket queue and one ticket with its order.

The queue is keyset-paginated with the app's one pagination helper (newest first, one indexed
range scan per page at any table size); a ticket page costs a fixed number of queries: the
ticket with its order, the conversation (notes and replies), the gateway's refunds of the order,
and the runs on it (the runtime's own run search, by the order's id as a whole search key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from agentruns.models import Run
from agentruns.runtime.values.money import format_cents
from agentruns.selectors import RunFilters, run_page
from agentruns.selectors.pagination import KeysetPage, keyset_page
from support.models import GatewayRefund, OutboxMessage, Ticket, TicketNote

PAGE_SIZE = 25
STATUSES = {"open": "open tickets", "any": "every ticket"}
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
    tickets = Ticket.objects.select_related("order").defer("search_text", "order__customer_email")
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


@dataclass
class Message:
    """One entry of a ticket's conversation: the customer's words, a reply sent, or a note."""

    kind: str  # "customer" | "reply" | "note"
    who: str
    text: str
    at: datetime
    run_id: Any = None  # the run that wrote it, when one did


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

    @property
    def order(self):
        return self.ticket.order

    @property
    def amount(self) -> str:
        return format_cents(self.order.amount_cents, self.order.currency)


def ticket_view(ticket: Ticket) -> TicketView:
    order = ticket.order
    notes = list(
        TicketNote.objects.filter(ticket=ticket).order_by("-created_at")[:TICKET_PAGE_ROWS]
    )
    replies = list(
        OutboxMessage.objects.filter(order=order)
        .only("body", "created_at", "run_id")
        .order_by("-created_at")[:TICKET_PAGE_ROWS]
    )
    conversation = [
        Message("customer", order.customer_name, ticket.body or ticket.subject, ticket.created_at),
        *(Message("reply", "reply sent", r.body, r.created_at, r.run_id) for r in replies),
        *(Message("note", "internal note", n.body, n.created_at) for n in notes),
    ]
    conversation.sort(key=lambda m: m.at)
    ledger = list(
        GatewayRefund.objects.filter(order_id=order.order_id).order_by("created_at", "id")[
            :TICKET_PAGE_ROWS
        ]
    )
    total = sum(r.amount_cents for r in ledger)
    runs = ticket_runs(ticket)
    return TicketView(
        ticket=ticket,
        conversation=conversation,
        refunds=[
            Refund(
                f"rf_{r.pk}", format_cents(r.amount_cents, order.currency), r.reason, r.created_at
            )
            for r in ledger
        ],
        refunded=format_cents(total, order.currency),
        refundable=format_cents(max(0, order.amount_cents - total), order.currency),
        fully_refunded=total >= order.amount_cents,
        runs=runs,
        active_runs=[r for r in runs if r.status in ACTIVE_RUN_STATUSES],
    )


def ticket_runs(ticket: Ticket) -> list[Run]:
    """Every run on the ticket's order (whichever door started it), newest first: the runtime's
    run search by the order's id as a whole search key (the refund agent's search fields)."""
    page = run_page(
        RunFilters(key=ticket.order.order_id),
        size=TICKET_PAGE_ROWS,
        fields=("created_by__username",),
    )
    return page.items
