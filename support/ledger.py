"""One refund per customer request, and an order's refunds never above what was paid: the refund
tool's declarations across runs (agentruns.registry `operation_key=`, `limit=`, `context=`), and
what the agent and the desk read of an order's refunds.

- The operation key is the request: `refund:<ticket_id>`. A ticket is paid once, whichever run
  asks (a later call is answered with the first one's refund, marked already done; a lead may
  allow one more); another ticket on the same order is another request.
- The limit is the order's: the gateway's ledger (what was actually refunded) plus the refunds
  of the order's other requests being made right now, plus this one, at most what was paid.
  The runtime checks it while the call holds its own key; calls of *different* keys are
  serialised here, on the order's row (`SELECT ... FOR UPDATE` inside the gate's transaction):
  the second waits for the first to take its key and then counts it as in flight, so two
  tickets of one order can never both pass on the same remainder.
- The context (beside the call in the inbox) and `order_refunds` (the agent's lookup, the ticket
  page): the order's refunds, each with the request it paid when known, and the totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from agentruns.models import OperationExecution, OperationState
from agentruns.registry import OverLimit
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.operations import held_arguments, key_state
from support.models import GatewayRefund, Order, Ticket

KEY_PREFIX = "refund:"


def refund_key(ticket_id: str) -> str:
    return f"{KEY_PREFIX}{ticket_id}"


def refund_operation_key(args: dict) -> str:
    """One refund per customer request (its ticket), whichever run asks (a lead may allow one
    more). A call without a ticket has no key: the runtime refuses it (it could not be kept
    single)."""
    return refund_key(args["ticket_id"])


def _in_flight_and_refunded(order_id: str, own_keys: list[str]) -> tuple[int, int]:
    """What the order's other requests are refunding right now, and what the gateway's ledger
    refunded of it. In flight: calls holding a refund key (being made, retried, or of unknown
    outcome) whose refund the ledger has not recorded: the calls holding a refund key anywhere
    are read (few: one per refund being made right now) and the order's kept by their
    arguments. `own_keys`: the call's own key (the limit is checked while the call holds it), and
    the order's own (a tool keyed per order).

    Read in this order, in two statements after the order's lock: the keys in flight first,
    then the ledger. A refund the gateway records in between is in the ledger, so it is counted
    there and not in flight; read the other way round, it would be counted in neither."""
    in_flight = [
        (key, args)
        for key, args in held_arguments(KEY_PREFIX, own_keys)
        if isinstance(args, dict) and args.get("order_id") == order_id
    ]
    with connection.cursor() as cursor:  # written out: every refund's "before" commit reads it
        cursor.execute(
            "SELECT idempotency_key, amount_cents FROM support_gatewayrefund WHERE order_id = %s",
            [order_id],
        )
        ledger = cursor.fetchall()
    refunded = sum(amount for _, amount in ledger)
    recorded = {key for key, _ in ledger}
    unrecorded = [key for key, _ in in_flight if key not in recorded]
    if unrecorded:  # recorded under another order id: recorded all the same
        recorded |= set(
            GatewayRefund.objects.filter(idempotency_key__in=unrecorded).values_list(
                "idempotency_key", flat=True
            )
        )
    amounts = (args.get("amount_cents") for key, args in in_flight if key not in recorded)
    return sum(a for a in amounts if isinstance(a, int) and not isinstance(a, bool)), refunded


def refund_limit(args: dict) -> OverLimit | None:
    """Over the limit when this refund, the order's earlier ones and the ones in flight for its
    other requests exceed what was paid; a ticket of another order is refused here too (its key
    would be another customer's request). An unknown order is the gateway's to refuse."""
    order_id, amount = _order_key(args.get("order_id")), args.get("amount_cents")
    ticket_id = args.get("ticket_id")
    named = "ticket_id" in args and isinstance(ticket_id, str)
    order, ticket_order = _locked_order(order_id, ticket_id if named else None)
    if order is None or not isinstance(amount, int):
        return None
    if "ticket_id" in args:
        refused = _other_orders_ticket(order, ticket_id, ticket_order)
        if refused is not None:
            return refused
    own = [refund_key(order.order_id)]
    if isinstance(args.get("ticket_id"), str):
        own.append(refund_key(args["ticket_id"]))
    in_flight, refunded = _in_flight_and_refunded(order.order_id, own)
    total = refunded + in_flight + amount
    if total <= order.amount_cents:
        return None
    currency = order.currency
    figures = {
        "order_id": order.order_id,
        "amount_cents": amount,
        "refunded_cents": refunded,
        "total_cents": total,
        "paid_cents": order.amount_cents,
        "currency": currency,
    }
    moving = ""
    if in_flight:
        figures["in_flight_cents"] = in_flight
        moving = f" ({format_cents(in_flight, currency)} of them being refunded right now)"
    return OverLimit(
        f"this refund of {format_cents(amount, currency)} would bring the order's refunds to "
        f"{format_cents(total)} of {format_cents(order.amount_cents, currency)} paid{moving}",
        figures,
    )


_LOCKED_ORDER_COLUMNS = ("id", "order_id", "amount_cents", "currency")
_LOCKED_ORDER_SQL = (
    f"SELECT {', '.join(f'o.{c}' for c in _LOCKED_ORDER_COLUMNS)}, "
    "(SELECT t_o.order_id FROM support_ticket t JOIN support_order t_o ON t_o.id = t.order_id "
    "WHERE t.ticket_id = %s) FROM support_order o WHERE o.order_id = %s"
)


def _locked_order(order_id: str | None, ticket_id: str | None) -> tuple[Order | None, str | None]:
    """The order, locked while the caller's transaction lasts (the order's refunds are checked
    one call at a time), with the order of the ticket named (None: none named, or no such
    ticket), in one statement written out: it runs in every refund's "before" commit."""
    if order_id is None:
        return None, None
    sql = _LOCKED_ORDER_SQL
    if connection.in_atomic_block and connection.features.has_select_for_update:
        sql += " FOR UPDATE OF o"
    with connection.cursor() as cursor:
        cursor.execute(sql, [ticket_id, order_id])
        row = cursor.fetchone()
    if row is None:
        return None, None
    return Order.from_db(connection.alias, _LOCKED_ORDER_COLUMNS, row[:-1]), row[-1]


def _other_orders_ticket(
    order: Order, ticket_id: object, ticket_order: str | None
) -> OverLimit | None:
    if ticket_order == order.order_id:
        return None
    where = f"is about order {ticket_order}" if ticket_order else "does not exist"
    return OverLimit(
        f"ticket {ticket_id} {where}, not {order.order_id}: a refund pays the order its request "
        "is about",
        {"order_id": order.order_id, "ticket_id": ticket_id},
    )


@dataclass
class OrderRefund:
    refund_id: str
    amount_cents: int
    at: datetime
    ticket_id: str | None  # the request it paid (None: made before refunds named their ticket)
    reason: str = ""  # what the gateway was told


@dataclass
class OrderRefunds:
    """An order's refunds as the gateway executed them, each with its request when known."""

    order: Order
    refunds: list[OrderRefund] = field(default_factory=list)

    @property
    def refunded_cents(self) -> int:
        return sum(r.amount_cents for r in self.refunds)

    @property
    def remaining_cents(self) -> int:
        return max(0, self.order.amount_cents - self.refunded_cents)

    def of_ticket(self, ticket_id: str) -> list[OrderRefund]:
        return [r for r in self.refunds if r.ticket_id == ticket_id]

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {
                "id": r.refund_id,
                "amount_cents": r.amount_cents,
                "at": iso(r.at),
                "ticket_id": r.ticket_id,
            }
            for r in self.refunds
        ]


def order_refunds(order: Order, limit: int | None = None) -> OrderRefunds:
    """The order's refunds, oldest first (at most `limit`, the newest kept), in three queries:
    the gateway's ledger, the order's tickets, and their refund keys' executions (whose results
    name the refunds they made)."""
    return orders_refunds([order], limit)[order.order_id]


def orders_refunds(orders: list[Order], limit: int | None = None) -> dict[str, OrderRefunds]:
    """`order_refunds` of each of these orders by order id, in the same three queries for them
    all (the inbox's page of refund cards reads its orders' refunds at once)."""
    by_order: dict[str, list[GatewayRefund]] = {order.order_id: [] for order in orders}
    if by_order:  # written out: every lookup of the agent reads it
        marks = ", ".join(["%s"] * len(by_order))
        ledger_rows = GatewayRefund.objects.raw(
            f"SELECT * FROM support_gatewayrefund WHERE order_id IN ({marks}) "
            "ORDER BY created_at, id",
            list(by_order),
        )
        for row in ledger_rows:
            by_order[row.order_id].append(row)
    ledgers = {order_id: rows[-limit:] if limit else rows for order_id, rows in by_order.items()}
    ids = {order_id: {f"rf_{r.pk}" for r in ledger} for order_id, ledger in ledgers.items()}
    # each refund's request: the refund keys' executions of the tickets of the orders with
    # refunds (an index lookup each), not every refund key's rows
    paid = [order for order in orders if ids[order.order_id]]
    tickets: dict[str, str] = {}  # refund id -> the ticket whose request it paid
    if paid:
        order_ids = {order.pk: order.order_id for order in paid}
        order_of_key = {
            refund_key(ticket_id): order_ids[order_pk]
            for ticket_id, order_pk in Ticket.objects.filter(order__in=paid).values_list(
                "ticket_id", "order_id"
            )
        }
        done = OperationExecution.objects.filter(
            key__in=list(order_of_key), state=OperationState.DONE
        ).values_list("key", "result")
        for key, result in done:
            refund_id = result.get("refund_id") if isinstance(result, dict) else None
            if isinstance(refund_id, str) and refund_id in ids[order_of_key[key]]:
                tickets[str(refund_id)] = key.removeprefix(KEY_PREFIX)
    found: dict[str, OrderRefunds] = {}
    for order in orders:
        refunds = found[order.order_id] = OrderRefunds(order)
        for row in ledgers[order.order_id]:
            refund_id = f"rf_{row.pk}"
            refunds.refunds.append(
                OrderRefund(
                    refund_id,
                    row.amount_cents,
                    row.created_at,
                    tickets.get(refund_id),
                    row.reason,
                )
            )
    return found


@dataclass
class RequestRefund:
    """The refund a request (ticket) already had: its key is used, so asking again pays nothing."""

    amount_cents: int | None
    refund_id: str
    at: datetime | None
    run_id: str


def request_refund(ticket_id: str) -> RequestRefund | None:
    """The refund of this request when its key is used (None: it may still be paid, its first
    time or one more a lead allowed)."""
    state = key_state(refund_key(ticket_id))
    done = state.last_done
    if state.status != "used" or done is None:
        return None
    result = done.result if isinstance(done.result, dict) else {}
    amount = result.get("amount_cents")
    return RequestRefund(
        amount if isinstance(amount, int) else None,
        str(result.get("refund_id") or ""),
        done.settled_at or done.created_at,
        str(done.run_id),
    )


def refund_context(args: dict) -> dict:
    """The order, its refunds so far (each with its request) and their total, for the approver
    (amounts in cents, in the order's `currency`)."""
    return refund_contexts([args])[0]


def refund_contexts(calls: list[dict]) -> list[dict]:
    """`refund_context` of each call, in order, in a fixed number of queries for them all (the
    orders, then `orders_refunds`): the inbox reads its page of cards this way
    (`refund_context.many`, agentruns.registry.operations.contexts_of), where a card each cost
    two to four queries."""
    wanted = {_order_key(args.get("order_id")) for args in calls} - {None}
    orders = {order.order_id: order for order in Order.objects.filter(order_id__in=wanted)}
    refunds = orders_refunds(list(orders.values()))
    contexts = []
    for args in calls:
        key = _order_key(args.get("order_id"))
        order = orders.get(key) if key is not None else None
        if order is None:
            contexts.append({"order": None, "note": f"no order {args.get('order_id')}"})
            continue
        paid = refunds[order.order_id]
        contexts.append(
            {
                "order": {
                    "order_id": order.order_id,
                    "customer_name": order.customer_name,
                    "item": order.item,
                    "paid_cents": order.amount_cents,
                },
                "ticket_id": args.get("ticket_id"),
                "currency": order.currency,
                "refunds": paid.as_json(),
                "refunded_cents": paid.refunded_cents,
                "remaining_cents": paid.remaining_cents,
            }
        )
    return contexts


refund_context.many = refund_contexts  # type: ignore[attr-defined]


def _order_key(value: object) -> str | None:
    """An `order_id` argument as the order_id column compares it (a CharField: a number or any
    other value by its text, None matching no order)."""
    return None if value is None else str(value)
