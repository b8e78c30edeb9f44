"""What the offline `scripted` model does for the refund agent.

It reads only the conversation and the tools it is offered (as a real model would), so a
resumed run and an uninterrupted one get the same turns. Flow: look up the order and the
customer's request (its ticket: the order's refunds so far, what is left, and whether this
request was refunded before) -> refund at most what is left -> note + reply -> summary. A
request refunded before is told so (how much, when), never refunded again; an order with
nothing left is told so; a question or an empty message is answered and asked back, nothing
refunded. Without `issue_refund` (a trainee's run: the tool policy of the starter's groups
leaves it out) it hands over instead: it calls `hand_over` (an item in the inbox that a person
picks up), tells the customer a colleague will take over, notes that on the ticket, and
finishes. With `staff_refund` in its input (a person refunding by hand on a hand-over) it makes
exactly that call, notes it and tells the customer.

What the customer reads is safe to send: a partial refund says it is partial and why (the amount
they asked for, what was left, or what our team approved on review, in the approver's words for
the customer), never an amount they did not ask for, and a rejection says only the reason the
approver gave for the customer (never their internal note, which the agent is never told).
"""

from __future__ import annotations

import json

from agentruns.registry import ScriptedTurn
from agentruns.runtime.values.money import format_cents
from support.policy.reading import asks_for_nothing, requested_amount_cents
from support.policy.replies import (
    answer,
    hand_over,
    not_refunded,
    nothing_left,
    refunded,
    request_refunded,
    staff_refund,
)

__all__ = ["asks_for_nothing", "refund_policy", "requested_amount_cents"]


def _results(messages: list[dict]) -> dict[str, dict]:
    """Latest result per tool name, from the assistant tool calls and tool messages."""
    names: dict[str, str] = {}
    results: dict[str, dict] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool":
            name = names.get(message.get("tool_call_id", ""))
            if name:
                try:
                    results[name] = json.loads(message["content"])
                except (TypeError, json.JSONDecodeError):
                    results[name] = {"error": message["content"]}
    return results


def _where(order_id: str, ticket_id: str | None) -> dict:
    """The arguments naming the customer's request, for the note and the reply."""
    return {"order_id": order_id, **({"ticket_id": ticket_id} if ticket_id else {})}


def refund_policy(messages: list[dict], tools: list[str] | None = None) -> ScriptedTurn:
    try:
        request = json.loads(messages[1]["content"])
    except (IndexError, KeyError, json.JSONDecodeError):
        request = {}
    if not isinstance(request, dict):
        request = {}
    order_id = str(request.get("order_id", "")).strip()
    asked_ticket = request.get("ticket_id") if isinstance(request.get("ticket_id"), str) else None
    message = request.get("message") if isinstance(request.get("message"), str) else None
    customer_text = message or ""
    staff = request.get("staff_refund") if isinstance(request.get("staff_refund"), dict) else None
    done = _results(messages)

    if "lookup_order" not in done or "error" in done["lookup_order"]:
        if "lookup_order" in done:  # the lookup failed: say so instead of looping
            return ScriptedTurn(
                text=f"I could not look up order {order_id}: {done['lookup_order']['error']}"
            )
        return ScriptedTurn(
            text=f"Let me look up order {order_id} first.",
            tool_calls=[("lookup_order", _where(order_id, asked_ticket))],
        )
    order = done["lookup_order"]
    if not order.get("found"):
        return ScriptedTurn(text=f"I could not find an order {order_id}; no refund was made.")
    currency = order.get("currency", "USD")
    name = (order.get("customer_name") or "there").split(" ")[0]
    where = _where(order_id, order.get("ticket_id"))
    may_refund = tools is None or "issue_refund" in tools
    if staff is not None:
        return staff_refund(order, name, staff, where, done, may_refund)
    if asks_for_nothing(message) and "issue_refund" not in done:
        return answer(order, name, customer_text, where, done)
    earlier = order.get("request_refunded")
    if isinstance(earlier, dict) and "issue_refund" not in done:
        return request_refunded(order_id, name, currency, earlier, where, done)
    paid = order["amount_cents"]
    remaining = order.get("remaining_cents")
    remaining = paid if not isinstance(remaining, int) else remaining
    asked = requested_amount_cents(customer_text)
    amount = asked if asked is not None and 0 < asked < paid else paid
    refused = "not allowed" in str(done.get("issue_refund", {}).get("error", ""))
    if not may_refund or refused:
        return hand_over(order_id, name, format_cents(amount, currency), where, done, tools)
    if remaining <= 0 and "issue_refund" not in done:
        return nothing_left(order, name, where, done)

    if "issue_refund" not in done:
        owed = min(amount, remaining)
        before = order.get("refunded_cents") or 0
        so_far = (
            f" {format_cents(before, currency)} of it was refunded already, so "
            f"{format_cents(remaining, currency)} is left."
            if before
            else ""
        )
        return ScriptedTurn(
            text=(
                f"Order {order_id} ({order.get('item') or 'item'}) was "
                f"{format_cents(paid, currency)}.{so_far} The customer is owed "
                f"{format_cents(owed, currency)}, so I will issue that refund."
            ),
            tool_calls=[
                (
                    "issue_refund",
                    {
                        **_where(order_id, order.get("ticket_id")),
                        "amount_cents": owed,
                        "reason": (customer_text or "customer request")[:200],
                    },
                )
            ],
        )
    refund = done["issue_refund"]
    if refund.get("already_done"):  # another run refunded this request (its operation key)
        result = refund.get("result") if isinstance(refund.get("result"), dict) else {}
        earlier = {
            "amount_cents": result.get("amount_cents"),
            "refund_id": result.get("refund_id"),
            "at": refund.get("done_at"),
        }
        return request_refunded(order_id, name, currency, earlier, where, done)

    if "send_customer_reply" not in done:
        if "refund_id" in refund:
            note, reply = refunded(order, name, refund, asked)
        else:
            note, reply = not_refunded(order_id, name, refund)
        return ScriptedTurn(
            text="Now I will note this on the ticket and reply to the customer.",
            tool_calls=[
                ("add_ticket_note", {**where, "note": note}),
                ("send_customer_reply", {**where, "message": reply}),
            ],
        )
    if "refund_id" in refund:
        return ScriptedTurn(
            text=(
                f"Done: refunded {format_cents(refund['amount_cents'], currency)} for order "
                f"{order_id} and told the customer."
            )
        )
    return ScriptedTurn(
        text=f"No refund was issued for order {order_id}; the customer has been told why."
    )
