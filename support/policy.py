"""What the offline `scripted` model does for the refund agent.

It reads only the conversation and the tools it is offered (as a real model would), so a
resumed run and an uninterrupted one get the same turns. Flow: look up the order -> refund ->
note + reply -> summary. Without `issue_refund` (a trainee's run: the tool policy of the
starter's groups leaves it out) it hands over instead: it calls `hand_over` (an item in the
inbox that a person picks up), tells the customer a colleague will take over, notes that on the
ticket, and finishes.

What the customer reads is safe to send: a partial refund says it is partial and why (the amount
they asked for, or what our team approved on review), and a rejection says only the reason the
approver gave for the customer (never their internal note, which the agent is never told).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation

from agentruns.registry import ScriptedTurn
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import moment_text

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?|\d+(?:[.,]\d{1,2})?"
_CURRENCY_WORD = r"usd|eur|gbp|dollars?|euros?|pounds?|bucks"
# what is never an amount: order and ticket numbers, dates, times, and digits glued to letters
_NOT_AMOUNTS = re.compile(
    r"(?:\b[A-Z]{2,}-\d+\b)"  # ORD-1001, T-ORD-1001
    r"|(?:#\d+)"  # #1001
    r"|(?:\b\d{4}-\d{1,2}-\d{1,2}\b)"  # 2024-05-01
    r"|(?:\b\d{1,2}[./-]\d{1,2}[./-]\d{2,4}\b)"  # 05/01/2024, 1.5.24, 01-05-2024
    r"|(?:\b\d{1,2}:\d{2}\b)"  # 10:30
    r"|(?:\b\d+(?:st|nd|rd|th)\b)"  # 3rd
    rf"|(?:\b\d+(?!(?:{_CURRENCY_WORD})\b)[A-Za-z]\w*)",  # 2x, 500ml (but not 10usd)
    re.IGNORECASE,
)
_AMOUNT = re.compile(
    rf"(?:[$€£]\s?(?P<a>{_NUMBER}))"  # $10, € 10,50
    rf"|(?:(?P<b>{_NUMBER})\s?(?:{_CURRENCY_WORD})\b)"  # 10 USD, 10.00 dollars
    rf"|(?:\b(?:{_CURRENCY_WORD})\s?(?P<c>{_NUMBER}))"  # USD 10
    rf"|(?:(?<![\d.,])(?P<d>\d+[.,]\d{{2}})(?![\d.,]*\d))"  # 10.00 (a bare number with cents)
    rf"|(?:\brefund(?:\s+(?:me|of|only|just))*\s+(?P<e>\d+)\b(?![.,/:-]?\d))",  # refund 10
    re.IGNORECASE,
)


def _cents(raw: str) -> int | None:
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?", raw):
        raw = raw.replace(",", "")  # 1,000.50: thousands separators
    else:
        raw = raw.replace(",", ".")  # 10,50: a decimal comma
    try:
        return int((Decimal(raw) * 100).to_integral_value())
    except InvalidOperation:
        return None


def requested_amount_cents(message: str) -> int | None:
    """The first amount the customer names, with or without a currency sign ("$10", "10 USD",
    "10.00", "refund 10"); never an order number, a date or a time."""
    text = _NOT_AMOUNTS.sub(lambda m: " " * len(m.group(0)), message or "")
    for match in _AMOUNT.finditer(text):
        raw = next(g for g in match.group("a", "b", "c", "d", "e") if g)
        cents = _cents(raw)
        if cents is not None:
            return cents
    return None


def _calls(messages: list[dict]) -> dict[str, dict]:
    """Latest arguments per tool name, from the assistant's own tool calls."""
    calls: dict[str, dict] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            try:
                calls[call["function"]["name"]] = json.loads(call["function"]["arguments"])
            except (TypeError, KeyError, json.JSONDecodeError):
                continue
    return calls


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


def _hand_over(
    order_id: str, name: str, amount: str, done: dict, tools: list[str] | None
) -> ScriptedTurn:
    if "send_customer_reply" not in done:
        why = f"the customer asks for a refund of {amount}; this run may not issue refunds"
        note = f"Hand-over: {why}, so a colleague must take over."
        reply = (
            f"Hi {name}, thank you for your message about order {order_id}. A colleague will "
            "take over your refund request and get back to you shortly."
        )
        calls: list[tuple[str, dict | str]] = []
        if tools is None or "hand_over" in tools:  # a person picks it up in the inbox
            calls.append(("hand_over", {"order_id": order_id, "reason": why}))
        calls += [
            ("add_ticket_note", {"order_id": order_id, "note": note}),
            ("send_customer_reply", {"order_id": order_id, "message": reply}),
        ]
        return ScriptedTurn(
            text="I may not issue refunds here, so I will hand this over to a colleague.",
            tool_calls=calls,
        )
    return ScriptedTurn(
        text=(
            f"Handed over: a colleague will take over the refund for order {order_id}; the "
            "customer has been told and the ticket noted."
        )
    )


def _already_refunded(
    order_id: str, name: str, currency: str, refund: dict, done: dict
) -> ScriptedTurn:
    """The refund call was answered "already done": the order's refund was made by another run
    (whose result it carries); say so on the ticket and to the customer, refund nothing."""
    earlier = refund.get("result") if isinstance(refund.get("result"), dict) else {}
    cents = earlier.get("amount_cents")
    paid = format_cents(cents, currency) if isinstance(cents, int) else ""
    what = f"{paid} ({earlier.get('refund_id')})" if paid else "a refund"
    when = moment_text(refund.get("done_at"))
    by = f"another run on {when}" if when else "another run"
    if "send_customer_reply" not in done:
        note = f"Not refunded again: {what} was already issued for this order by {by}."
        reply = (
            f"Hi {name}, a refund of {paid} for order {order_id} was already issued. It should "
            "appear on your statement within 5 business days."
            if paid
            else f"Hi {name}, your refund for order {order_id} is already being handled; we "
            "will get back to you if anything is missing."
        )
        return ScriptedTurn(
            text="This order was already refunded by another run, so I will not refund it again.",
            tool_calls=[
                ("add_ticket_note", {"order_id": order_id, "note": note}),
                ("send_customer_reply", {"order_id": order_id, "message": reply}),
            ],
        )
    return ScriptedTurn(
        text=(
            f"Already done: order {order_id} was already refunded ({what}) by another run; "
            "nothing was refunded again and the customer has been told."
        )
    )


def _refunded(
    order: dict, name: str, refund: dict, asked_for: object, asked: int | None
) -> tuple[str, str]:
    """The note and the reply of a refund made: a partial one says so, and why."""
    currency, order_id = order.get("currency", "USD"), order["order_id"]
    cents, paid = refund["amount_cents"], order["amount_cents"]
    done = f"{format_cents(cents, currency)} ({refund['refund_id']})"
    statement = "It should appear on your statement within 5 business days."
    if cents >= paid:
        note = f"Refunded {done} at the customer's request."
        reply = f"Hi {name}, we have refunded {format_cents(cents, currency)} for order {order_id}."
        return note, f"{reply} {statement}"
    part = f"{format_cents(cents)} of {format_cents(paid, currency)}"
    if isinstance(asked_for, int) and cents < asked_for:  # lowered by an approver on review
        because = (
            f"our team reviewed your request for {format_cents(asked_for, currency)} and "
            f"approved {format_cents(cents, currency)}"
        )
        noted = "partial: lowered on review"
    elif asked is not None:
        because = "that is the amount you asked us to refund"
        noted = "partial: the amount the customer asked for"
    else:
        because = f"{format_cents(cents, currency)} is what could be refunded for this order"
        noted = "partial"
    note = f"Refunded {part} ({refund['refund_id']}), {noted}."
    reply = f"Hi {name}, we refunded {part} for order {order_id} because {because}."
    return note, f"{reply} {statement}"


def _not_refunded(order_id: str, name: str, refund: dict) -> tuple[str, str]:
    """The note and the reply of a refund not made. A person's rejection says only the reason
    they gave for the customer (the result carries nothing else); a failure says what failed."""
    if refund.get("error") == "rejected":
        why = str(refund.get("reason") or "").strip().rstrip(".")  # one full stop, not ".."
        note = f"Refund rejected{': ' + why if why else ''}."
    else:
        why = str(refund.get("reason") or refund.get("error") or "it could not be processed")
        why = why.strip().rstrip(".")
        note = f"Refund not issued: {why}."
    said = f": {why}." if why else "."
    reply = (
        f"Hi {name}, we are sorry, but we could not approve a refund for order {order_id}{said} "
        "Reply to this message if you have questions."
    )
    return note, reply


def refund_policy(messages: list[dict], tools: list[str] | None = None) -> ScriptedTurn:
    try:
        request = json.loads(messages[1]["content"])
    except (IndexError, KeyError, json.JSONDecodeError):
        request = {}
    order_id = str(request.get("order_id", "")).strip()
    customer_text = str(request.get("message", ""))
    done = _results(messages)

    if "lookup_order" not in done or "error" in done["lookup_order"]:
        if "lookup_order" in done:  # the lookup failed: say so instead of looping
            return ScriptedTurn(
                text=f"I could not look up order {order_id}: {done['lookup_order']['error']}"
            )
        return ScriptedTurn(
            text=f"Let me look up order {order_id} first.",
            tool_calls=[("lookup_order", {"order_id": order_id})],
        )
    order = done["lookup_order"]
    if not order.get("found"):
        return ScriptedTurn(text=f"I could not find an order {order_id}; no refund was made.")
    currency = order.get("currency", "USD")
    name = order.get("customer_name", "there").split(" ")[0]
    amount = order["amount_cents"]
    asked = requested_amount_cents(customer_text)
    if asked is not None and 0 < asked < amount:
        amount = asked
    may_refund = tools is None or "issue_refund" in tools
    refused = "not allowed" in str(done.get("issue_refund", {}).get("error", ""))
    if not may_refund or refused:
        return _hand_over(order_id, name, format_cents(amount, currency), done, tools)

    if "issue_refund" not in done:
        return ScriptedTurn(
            text=(
                f"Order {order_id} ({order.get('item') or 'item'}) was {format_cents(order['amount_cents'], currency)}. "
                f"The customer is owed {format_cents(amount, currency)}, so I will issue that refund."
            ),
            tool_calls=[
                (
                    "issue_refund",
                    {
                        "order_id": order_id,
                        "amount_cents": amount,
                        "reason": (customer_text or "customer request")[:200],
                    },
                )
            ],
        )
    refund = done["issue_refund"]
    if refund.get("already_done"):  # another run refunded this order (its operation key)
        return _already_refunded(order_id, name, currency, refund, done)

    if "send_customer_reply" not in done:
        asked_for = _calls(messages).get("issue_refund", {}).get("amount_cents")
        if "refund_id" in refund:
            note, reply = _refunded(order, name, refund, asked_for, asked)
        else:
            note, reply = _not_refunded(order_id, name, refund)
        return ScriptedTurn(
            text="Now I will note this on the ticket and reply to the customer.",
            tool_calls=[
                ("add_ticket_note", {"order_id": order_id, "note": note}),
                ("send_customer_reply", {"order_id": order_id, "message": reply}),
            ],
        )
    if "refund_id" in refund:
        return ScriptedTurn(
            text=(
                f"Done: refunded {format_cents(refund['amount_cents'], currency)} for order {order_id} "
                "and told the customer."
            )
        )
    return ScriptedTurn(
        text=f"No refund was issued for order {order_id}; the customer has been told why."
    )
