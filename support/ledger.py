"""What an order's refunds add up to, for the refund tool's declarations across runs
(agentruns.registry `limit=` and `context=`): the refunds of an order never exceed what was paid
for it, whichever runs and how many partial refunds made them, and an approver sees the order's
refunds so far before deciding. Read from the gateway's ledger: what was actually refunded.

The runtime checks the limit while the call holds the order's operation key
(`refund:<order_id>`), so two refunds of one order are never checked at the same moment.
"""

from __future__ import annotations

from django.db.models import Sum

from agentruns.registry import OverLimit
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import iso
from support.models import GatewayRefund, Order


def refund_operation_key(args: dict) -> str:
    """One refund per order, whichever run asks (a lead may allow one more)."""
    return f"refund:{args['order_id']}"


def _refunded_cents(order_id: str) -> int:
    total = GatewayRefund.objects.filter(order_id=order_id).aggregate(total=Sum("amount_cents"))
    return int(total["total"] or 0)


def refund_limit(args: dict) -> OverLimit | None:
    """Over the limit when this refund and the order's earlier ones exceed what was paid. An
    unknown order is no limit's business: the gateway refuses it."""
    order = Order.objects.filter(order_id=args.get("order_id")).first()
    amount = args.get("amount_cents")
    if order is None or not isinstance(amount, int):
        return None
    refunded = _refunded_cents(order.order_id)
    total = refunded + amount
    if total <= order.amount_cents:
        return None
    currency = order.currency
    return OverLimit(
        f"this refund of {format_cents(amount, currency)} would bring the order's refunds to "
        f"{format_cents(total)} of {format_cents(order.amount_cents, currency)} paid",
        {
            "order_id": order.order_id,
            "amount_cents": amount,
            "refunded_cents": refunded,
            "total_cents": total,
            "paid_cents": order.amount_cents,
            "currency": currency,
        },
    )


def refund_context(args: dict) -> dict:
    """The order, its refunds so far and their total, for the approver (amounts in cents, in
    the order's `currency`)."""
    order = Order.objects.filter(order_id=args.get("order_id")).first()
    if order is None:
        return {"order": None, "note": f"no order {args.get('order_id')}"}
    refunds = list(GatewayRefund.objects.filter(order_id=order.order_id).order_by("id"))
    refunded = sum(r.amount_cents for r in refunds)
    return {
        "order": {
            "order_id": order.order_id,
            "customer_name": order.customer_name,
            "item": order.item,
            "paid_cents": order.amount_cents,
        },
        "currency": order.currency,
        "refunds": [
            {"id": f"rf_{r.pk}", "amount_cents": r.amount_cents, "at": iso(r.created_at)}
            for r in refunds
        ],
        "refunded_cents": refunded,
        "remaining_cents": max(0, order.amount_cents - refunded),
    }
