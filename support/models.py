"""The demo domain: orders, tickets, and the refund gateway's own ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models

from agentruns.runtime.values.money import format_cents


class Order(models.Model):
    order_id = models.CharField(max_length=20, unique=True)
    customer_name = models.CharField(max_length=120)
    customer_email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    currency = models.CharField(max_length=3, default="USD")
    item = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=20, default="delivered")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.order_id

    def save(self, *args, **kwargs) -> None:
        existed = not self._state.adding
        super().save(*args, **kwargs)
        if existed:  # its tickets' search words name its customer: keep them current
            for ticket in self.tickets.all():
                ticket.save(update_fields=["search_text"])

    @property
    def amount(self) -> str:
        """The amount as people read it: "358.18 USD"."""
        return format_cents(self.amount_cents, self.currency)


class TicketStatus(models.TextChoices):
    """Where a customer's request stands on the desk. Open: it needs someone (new, answered by
    the agent, or handed over and not finished yet). Resolved: a person finished it (closed its
    hand-over), `resolved_by` who and `resolved_at` when; the queue's default leaves it out."""

    OPEN = "open", "open"
    RESOLVED = "resolved", "resolved"


class Ticket(models.Model):
    ticket_id = models.CharField(max_length=20, unique=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="tickets")
    subject = models.CharField(max_length=200)
    body = models.TextField()
    status = models.CharField(
        max_length=20, choices=TicketStatus.choices, default=TicketStatus.OPEN
    )
    # who finished the request and when (a person closing its hand-over): None while open
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # who logged it through `POST /api/tickets` (None: the demo's seed, or an admin), and the
    # sender's Idempotency-Key (scoped to that sender): a retried POST finds its ticket
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    intake_key = models.CharField(max_length=220, null=True, blank=True, unique=True)
    # what the desk's search matches (support/desk/__init__.py): the ticket and order keys, the customer's
    # name and email, the subject and the message; one trigram index serves it (migration 0004)
    search_text = models.TextField(blank=True, default="", editable=False)

    class Meta:
        indexes = [
            # the desk's queue: open tickets, newest first (support/desk/__init__.py, keyset pages)
            models.Index(
                fields=["-created_at", "-id"],
                condition=models.Q(status=TicketStatus.OPEN),
                name="ticket_open_created_idx",
            ),
            models.Index(fields=["-created_at", "-id"], name="ticket_created_idx"),
        ]

    def __str__(self) -> str:
        return self.ticket_id

    def save(self, *args, **kwargs) -> None:
        self.search_text = ticket_search_text(self.ticket_id, self.order, self.subject, self.body)
        if "update_fields" in kwargs and kwargs["update_fields"] is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "search_text"}
        super().save(*args, **kwargs)

    def resolve(self, *, by: Any, at: datetime) -> None:
        """A person finished this request (closed its hand-over): resolved by `by` at `at`.
        One UPDATE (no search words to recompute), inside the caller's transaction; resolving
        a resolved ticket again names the latest person."""
        resolved_by = by if getattr(by, "is_authenticated", False) else None
        Ticket.objects.filter(pk=self.pk).update(
            status=TicketStatus.RESOLVED, resolved_by=resolved_by, resolved_at=at
        )
        self.status, self.resolved_by, self.resolved_at = TicketStatus.RESOLVED, resolved_by, at

    @property
    def status_text(self) -> str:
        """The status as the desk shows it: "open", or "resolved by approver"."""
        if self.status == TicketStatus.RESOLVED and self.resolved_by_id is not None:
            return f"resolved by {self.resolved_by.get_username()}"
        return self.get_status_display()


SEARCHED_BODY_CHARS = 4000  # a very long message is searched by its beginning


def ticket_search_text(ticket_id: str, order: Order, subject: str, body: str) -> str:
    words = (ticket_id, order.order_id, order.customer_name, order.customer_email, subject)
    return " ".join((*words, body[:SEARCHED_BODY_CHARS]))


class TicketNote(models.Model):
    ticket = models.ForeignKey(Ticket, on_delete=models.CASCADE, related_name="notes")
    body = models.TextField()
    # the person who wrote it on the ticket page ("": the agent, through `add_ticket_note`)
    author = models.CharField(max_length=150, blank=True, default="")
    # the writing step's key: a re-executed step finds its note instead of adding another
    idempotency_key = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"note on {self.ticket_id}"


class OutboxMessage(models.Model):
    """A customer reply waiting to be mailed. `send_customer_reply` has no idempotency key."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="replies")
    # the customer's request it answers (None: a reply from before replies named their ticket)
    ticket = models.ForeignKey(
        Ticket, null=True, blank=True, on_delete=models.SET_NULL, related_name="replies"
    )
    to = models.EmailField()
    body = models.TextField()
    run_id = models.UUIDField(null=True, blank=True)
    step_id = models.UUIDField(null=True, blank=True)
    # a person's reply from the ticket page: who wrote it, and its form's one-time token (a
    # double click sends one reply); "" and None for the agent's
    sent_by = models.CharField(max_length=150, blank=True, default="")
    idempotency_key = models.CharField(max_length=100, null=True, blank=True, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"reply to {self.to}"


class GatewayRefund(models.Model):
    """What the simulated payment service actually executed: one row per Idempotency-Key."""

    order_id = models.CharField(max_length=20, db_index=True)
    amount_cents = models.PositiveIntegerField()
    reason = models.TextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # the W3C trace context the caller sent (a real provider logs it): whose trace asked; a
    # database default too, for writers that insert rows by SQL (benchmarks/workload.py)
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")

    def __str__(self) -> str:
        return f"refund {self.amount_cents} on {self.order_id}"

    def as_dict(self) -> dict:
        return {
            "id": f"rf_{self.pk}",
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "idempotency_key": self.idempotency_key,
            "created_at": self.created_at.isoformat(),
            "traceparent": self.traceparent,
            "status": "succeeded",
        }
