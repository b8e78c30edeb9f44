"""The demo domain: orders, tickets, and the refund gateway's own ledger."""

from __future__ import annotations

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

    @property
    def amount(self) -> str:
        """The amount as people read it: "358.18 USD"."""
        return format_cents(self.amount_cents, self.currency)


class Ticket(models.Model):
    ticket_id = models.CharField(max_length=20, unique=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="tickets")
    subject = models.CharField(max_length=200)
    body = models.TextField()
    status = models.CharField(max_length=20, default="open")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # the desk's queue: open tickets, newest first (support/desk.py, keyset pages)
            models.Index(
                fields=["-created_at", "-id"],
                condition=models.Q(status="open"),
                name="ticket_open_created_idx",
            ),
            models.Index(fields=["-created_at", "-id"], name="ticket_created_idx"),
        ]

    def __str__(self) -> str:
        return self.ticket_id


class TicketNote(models.Model):
    ticket = models.ForeignKey(Ticket, on_delete=models.CASCADE, related_name="notes")
    body = models.TextField()
    # the writing step's key: a re-executed step finds its note instead of adding another
    idempotency_key = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"note on {self.ticket_id}"


class OutboxMessage(models.Model):
    """A customer reply waiting to be mailed. `send_customer_reply` has no idempotency key."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="replies")
    to = models.EmailField()
    body = models.TextField()
    run_id = models.UUIDField(null=True, blank=True)
    step_id = models.UUIDField(null=True, blank=True)
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
