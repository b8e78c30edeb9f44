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


# what makes a message a request for money back or about something wrong (else a question, or
# nothing asked: the agent answers or asks back, refunding nothing)
_PROBLEM = re.compile(
    r"refund|money back|reimburs|\breturn|broke|damag|defect|fault|crack|leak|torn|ripped|"
    r"scratch|missing|never (?:arrived|came|got)|not (?:arrived|delivered|received)|"
    r"didn'?t (?:arrive|come|get)|did not (?:arrive|come|get)|wrong|not what i ordered|"
    r"stopped working|(?:doesn'?t|does not|won'?t|will not) work|not working|charged twice|"
    r"double charged|\bdead\b|flicker|\blate\b|cancel",
    re.IGNORECASE,
)
_QUESTION = re.compile(r"\?|\bquestion\b|\bwonder|\bhow (?:do|can|long)\b", re.IGNORECASE)


def asks_for_nothing(message: str | None) -> bool:
    """A message that asks for no refund and names no problem: empty, or a question ("Hi, I
    have a question about my backpack"). A run without any message (`message` absent from its
    input) is the documented programmatic request: refund the order (DESIGN.md 6)."""
    if message is None:
        return False
    text = message.strip()
    if not text:
        return True
    if _PROBLEM.search(text) or requested_amount_cents(text) is not None:
        return False
    return bool(_QUESTION.search(text))


def _where(order_id: str, ticket_id: str | None) -> dict:
    """The arguments naming the customer's request, for the note and the reply."""
    return {"order_id": order_id, **({"ticket_id": ticket_id} if ticket_id else {})}


def _answer(order: dict, name: str, message: str, where: dict, done: dict) -> ScriptedTurn:
    """A question, or nothing asked: say what we know of the order, ask what they need."""
    order_id, currency = order["order_id"], order.get("currency", "USD")
    item = order.get("item") or "order"
    if "send_customer_reply" in done:
        return ScriptedTurn(
            text=f"Answered the customer about order {order_id} and asked what they need; no "
            "refund was asked for, so none was made."
        )
    refunded = order.get("refunded_cents") or 0
    facts = f"Your order {order_id} ({item}, {format_cents(order['amount_cents'], currency)})"
    facts += f" is {order['status']}" if order.get("status") else ""
    facts += (
        f"; {format_cents(refunded, currency)} of it was refunded so far."
        if refunded
        else "; no refund has been made on it."
    )
    if message.strip():
        opening = f"Hi {name}, thank you for your question about your {item}."
        ask = (
            "What would you like to know? If something is wrong with it, tell us what happened "
            "and we will sort it out."
        )
        noted = "The customer asks a question and names no problem: answered and asked back."
    else:
        opening = f"Hi {name}, thank you for contacting us about order {order_id}."
        ask = "Could you tell us what happened or what you need? We will get back to you quickly."
        noted = "The customer's message was empty: asked what they need."
    return ScriptedTurn(
        text="The customer asks no refund, so I will answer and ask what they need.",
        tool_calls=[
            ("add_ticket_note", {**where, "note": noted}),
            ("send_customer_reply", {**where, "message": f"{opening} {facts} {ask}"}),
        ],
    )


def _hand_over(
    order_id: str, name: str, amount: str, where: dict, done: dict, tools: list[str] | None
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
            calls.append(("hand_over", {**where, "reason": why}))
        calls += [
            ("add_ticket_note", {**where, "note": note}),
            ("send_customer_reply", {**where, "message": reply}),
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


def _paid_before(cents: object, currency: str, at: object) -> str:
    """ "100.00 USD on Dec 6, 09:14" (what is known of it)."""
    paid = format_cents(cents, currency) if isinstance(cents, int) else "a refund"
    when = moment_text(at if isinstance(at, str) else None)
    return f"{paid} on {when}" if when else paid


def _request_refunded(
    order_id: str, name: str, currency: str, earlier: dict, where: dict, done: dict
) -> ScriptedTurn:
    """This request was paid already (its operation key is used, by this run's lookup or by the
    refund call answered "already done"): say so on the ticket and to the customer, with the
    amount and when; refund nothing."""
    paid = _paid_before(earlier.get("amount_cents"), currency, earlier.get("at"))
    if "send_customer_reply" in done:
        return ScriptedTurn(
            text=f"Already refunded: this request on order {order_id} was refunded ({paid}); "
            "nothing was refunded again and the customer has been told."
        )
    refund_id = earlier.get("refund_id") or ""
    note = f"Not refunded again: this request was already refunded ({paid}{', ' + refund_id if refund_id else ''})."
    reply = (
        f"Hi {name}, your refund request for order {order_id} was already refunded: {paid}. "
        "It should appear on your statement within 5 business days."
    )
    return ScriptedTurn(
        text="This request was already refunded, so I will not refund it again.",
        tool_calls=[
            ("add_ticket_note", {**where, "note": note}),
            ("send_customer_reply", {**where, "message": reply}),
        ],
    )


def _nothing_left(order: dict, name: str, where: dict, done: dict) -> ScriptedTurn:
    """The order's refunds already reach what was paid: nothing is left to refund."""
    order_id, currency = order["order_id"], order.get("currency", "USD")
    paid = format_cents(order["amount_cents"], currency)
    if "send_customer_reply" in done:
        return ScriptedTurn(
            text=f"Order {order_id} was refunded in full already; nothing more was refunded and "
            "the customer has been told."
        )
    refunds = [r for r in order.get("refunds") or [] if isinstance(r, dict)]
    when = "; ".join(_paid_before(r.get("amount_cents"), currency, r.get("at")) for r in refunds)
    note = f"Not refunded: the order's refunds already reach the {paid} paid ({when})."
    reply = (
        f"Hi {name}, order {order_id} was already refunded in full ({paid}: {when}), so there "
        "is nothing more we can refund. Reply to this message if something is missing."
    )
    return ScriptedTurn(
        text="The order was already refunded in full, so I will refund nothing more.",
        tool_calls=[
            ("add_ticket_note", {**where, "note": note}),
            ("send_customer_reply", {**where, "message": reply}),
        ],
    )


def _sentence(text: str, *, capital: bool = True) -> str:
    """`text` as a sentence: its first letter upper case (unless it follows a colon), a full
    stop at its end."""
    text = text.strip()
    if capital:
        text = text[:1].upper() + text[1:]
    return text if text[-1:] in ".!?" else f"{text}."


def _refunded(
    order: dict, name: str, refund: dict, asked: int | None, by_staff: bool = False
) -> tuple[str, str]:
    """The note and the reply of a refund made: a partial one says so and why, and what an
    approver wrote for the customer is passed on in their words. Never says the customer asked
    for an amount they did not name."""
    currency, order_id = order.get("currency", "USD"), order["order_id"]
    cents, paid = refund["amount_cents"], order["amount_cents"]
    earlier = int(order.get("refunded_cents") or 0)
    done = f"{format_cents(cents, currency)} ({refund['refund_id']})"
    statement = "It should appear on your statement within 5 business days."
    words = str(refund.get("approver_reason") or "").strip()
    lowered = isinstance(refund.get("requested_cents"), int) and cents < refund["requested_cents"]
    if cents >= paid:
        note = f"Refunded {done} at the customer's request."
        reply = f"Hi {name}, we have refunded {format_cents(cents, currency)} for order {order_id}."
        return note, f"{reply}{_from_our_team(words)} {statement}"
    part = f"{format_cents(cents)} of {format_cents(paid, currency)}"
    reply = f"Hi {name}, we refunded {part} for order {order_id}"
    if by_staff:
        noted = "by a colleague on the hand-over"
        reply += f".{_from_our_team(words)}"
    elif lowered:
        noted = "partial: lowered on review" + (f" ({words})" if words else "")
        if asked is not None and cents < asked:
            review = (
                f" You asked for {format_cents(asked, currency)}; our team reviewed your request "
                f"and approved {format_cents(cents, currency)}"
            )
        else:
            review = " Our team reviewed your request and approved this amount"
        reply += f".{review}: {_sentence(words, capital=False)}" if words else f".{review}."
    elif asked is not None and cents <= asked:
        noted = "partial: the amount the customer asked for"
        reply += f" because that is the amount you asked us to refund.{_from_our_team(words)}"
    elif earlier and earlier + cents >= paid:
        noted = f"partial: what was left after {format_cents(earlier, currency)} refunded earlier"
        reply += (
            f" because {format_cents(earlier, currency)} of it was refunded earlier: this is what "
            f"was left.{_from_our_team(words)}"
        )
    else:
        noted = "partial"
        reply += f".{_from_our_team(words)}"
    note = f"Refunded {part} ({refund['refund_id']}), {noted}."
    return note, f"{reply} {statement}"


def _from_our_team(words: str) -> str:
    """An approver's words for the customer, passed on as they wrote them ("" for none)."""
    return f" A note from our team: {_sentence(words)}" if words else ""


def _not_refunded(order_id: str, name: str, refund: dict) -> tuple[str, str]:
    """The note and the reply of a refund not made. A person's rejection says only the reason
    they gave for the customer (the result carries nothing else); a refusal by the order's limit
    says the order's refunds already reach what was paid; a failure says it could not be made."""
    why = str(refund.get("reason") or "").strip()
    if refund.get("error") == "rejected" and why.startswith("refused:"):
        note = f"Refund not issued: {why.removeprefix('refused:').strip()}."
        said = (
            ": the refunds of this order already reach what was paid."
            if "paid" in why
            else ": it could not be made."
        )
    elif refund.get("error") == "rejected":
        note = f"Refund rejected{': ' + why if why else ''}."
        said = f": {why.rstrip('.')}." if why else "."
    else:
        why = str(refund.get("error") or "it could not be processed")
        note = f"Refund not issued: {why}."
        said = "."
    reply = (
        f"Hi {name}, we are sorry, but we could not approve a refund for order {order_id}{said} "
        "Reply to this message if you have questions."
    )
    return note, reply


def _staff_refund(
    order: dict, name: str, staff: dict, where: dict, done: dict, may_refund: bool
) -> ScriptedTurn:
    """A person refunds by hand (the ticket page, on a hand-over) through this agent's own refund
    tool: exactly their amount, the same key, limit and approval rules as the agent's call."""
    order_id, currency = order["order_id"], order.get("currency", "USD")
    amount = staff.get("amount_cents")
    words = str(staff.get("reason") or "").strip()
    if not may_refund:
        return ScriptedTurn(
            text=f"Refunds are not allowed for this run's starter: nothing was refunded on order "
            f"{order_id}."
        )
    if "issue_refund" not in done:
        return ScriptedTurn(
            text=f"Refunding {format_cents(amount, currency)} on order {order_id}, as a colleague "
            "asked on the hand-over.",
            tool_calls=[
                (
                    "issue_refund",
                    {
                        **where,
                        "amount_cents": amount,
                        "reason": (words or "refund by a colleague on the hand-over")[:200],
                    },
                )
            ],
        )
    refund = done["issue_refund"]
    if "add_ticket_note" in done:
        return ScriptedTurn(text="Done: the refund by hand is noted on the ticket.")
    calls: list[tuple[str, dict | str]] = []
    if refund.get("already_done"):
        earlier = refund.get("result") if isinstance(refund.get("result"), dict) else {}
        paid = _paid_before(earlier.get("amount_cents"), currency, refund.get("done_at"))
        note = f"Not refunded again: this request was already refunded ({paid})."
        calls.append(("add_ticket_note", {**where, "note": note}))
    elif "refund_id" in refund:
        note, reply = _refunded(order, name, {**refund, "approver_reason": words}, None, True)
        calls += [
            ("add_ticket_note", {**where, "note": note}),
            ("send_customer_reply", {**where, "message": reply}),
        ]
    else:
        note, _ = _not_refunded(order_id, name, refund)
        calls.append(("add_ticket_note", {**where, "note": note}))
    return ScriptedTurn(text="Noting the refund by hand on the ticket.", tool_calls=calls)


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
        return _staff_refund(order, name, staff, where, done, may_refund)
    if asks_for_nothing(message) and "issue_refund" not in done:
        return _answer(order, name, customer_text, where, done)
    earlier = order.get("request_refunded")
    if isinstance(earlier, dict) and "issue_refund" not in done:
        return _request_refunded(order_id, name, currency, earlier, where, done)
    paid = order["amount_cents"]
    remaining = order.get("remaining_cents")
    remaining = paid if not isinstance(remaining, int) else remaining
    asked = requested_amount_cents(customer_text)
    amount = asked if asked is not None and 0 < asked < paid else paid
    refused = "not allowed" in str(done.get("issue_refund", {}).get("error", ""))
    if not may_refund or refused:
        return _hand_over(order_id, name, format_cents(amount, currency), where, done, tools)
    if remaining <= 0 and "issue_refund" not in done:
        return _nothing_left(order, name, where, done)

    if "issue_refund" not in done:
        owed = min(amount, remaining)
        refunded = order.get("refunded_cents") or 0
        so_far = (
            f" {format_cents(refunded, currency)} of it was refunded already, so "
            f"{format_cents(remaining, currency)} is left."
            if refunded
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
        return _request_refunded(order_id, name, currency, earlier, where, done)

    if "send_customer_reply" not in done:
        if "refund_id" in refund:
            note, reply = _refunded(order, name, refund, asked)
        else:
            note, reply = _not_refunded(order_id, name, refund)
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
