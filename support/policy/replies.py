"""The refund agent's turns that end a request, in the offline model's words: the note on the
ticket and the reply to the customer for each way a request ends (refunded, partly or in full;
rejected or refused; paid before; nothing left; a question answered; handed over; a refund by a
colleague's hand). What the customer reads is safe to send: never the approver's internal note,
never an amount the customer did not ask for."""

from __future__ import annotations

from agentruns.registry import ScriptedTurn
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import moment_text


def answer(order: dict, name: str, message: str, where: dict, done: dict) -> ScriptedTurn:
    """A question, or nothing asked: say what we know of the order, ask what they need."""
    order_id, currency = order["order_id"], order.get("currency", "USD")
    item = order.get("item") or "order"
    if "send_customer_reply" in done:
        return ScriptedTurn(
            text=f"Answered the customer about order {order_id} and asked what they need; no "
            "refund was asked for, so none was made."
        )
    so_far = order.get("refunded_cents") or 0
    facts = f"Your order {order_id} ({item}, {format_cents(order['amount_cents'], currency)})"
    facts += f" is {order['status']}" if order.get("status") else ""
    facts += (
        f"; {format_cents(so_far, currency)} of it was refunded so far."
        if so_far
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


def hand_over(
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


def paid_before(cents: object, currency: str, at: object) -> str:
    """ "100.00 USD on Dec 6, 09:14" (what is known of it)."""
    paid = format_cents(cents, currency) if isinstance(cents, int) else "a refund"
    when = moment_text(at if isinstance(at, str) else None)
    return f"{paid} on {when}" if when else paid


def request_refunded(
    order_id: str, name: str, currency: str, earlier: dict, where: dict, done: dict
) -> ScriptedTurn:
    """This request was paid already (its operation key is used, by this run's lookup or by the
    refund call answered "already done"): say so on the ticket and to the customer, with the
    amount and when; refund nothing."""
    paid = paid_before(earlier.get("amount_cents"), currency, earlier.get("at"))
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


def nothing_left(order: dict, name: str, where: dict, done: dict) -> ScriptedTurn:
    """The order's refunds already reach what was paid: nothing is left to refund."""
    order_id, currency = order["order_id"], order.get("currency", "USD")
    paid = format_cents(order["amount_cents"], currency)
    if "send_customer_reply" in done:
        return ScriptedTurn(
            text=f"Order {order_id} was refunded in full already; nothing more was refunded and "
            "the customer has been told."
        )
    refunds = [r for r in order.get("refunds") or [] if isinstance(r, dict)]
    when = "; ".join(paid_before(r.get("amount_cents"), currency, r.get("at")) for r in refunds)
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


def sentence(text: str, *, capital: bool = True) -> str:
    """`text` as a sentence: its first letter upper case (unless it follows a colon), a full
    stop at its end."""
    text = text.strip()
    if capital:
        text = text[:1].upper() + text[1:]
    return text if text[-1:] in ".!?" else f"{text}."


def refunded(
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
        return note, f"{reply}{from_our_team(words)} {statement}"
    part = f"{format_cents(cents)} of {format_cents(paid, currency)}"
    reply = f"Hi {name}, we refunded {part} for order {order_id}"
    if by_staff:
        noted = "by a colleague on the hand-over"
        reply += f".{from_our_team(words)}"
    elif lowered:
        noted = "partial: lowered on review" + (f" ({words})" if words else "")
        if asked is not None and cents < asked:
            review = (
                f" You asked for {format_cents(asked, currency)}; our team reviewed your request "
                f"and approved {format_cents(cents, currency)}"
            )
        else:
            review = " Our team reviewed your request and approved this amount"
        reply += f".{review}: {sentence(words, capital=False)}" if words else f".{review}."
    elif asked is not None and cents <= asked:
        noted = "partial: the amount the customer asked for"
        reply += f" because that is the amount you asked us to refund.{from_our_team(words)}"
    elif earlier and earlier + cents >= paid:
        noted = f"partial: what was left after {format_cents(earlier, currency)} refunded earlier"
        reply += (
            f" because {format_cents(earlier, currency)} of it was refunded earlier: this is what "
            f"was left.{from_our_team(words)}"
        )
    else:
        noted = "partial"
        reply += f".{from_our_team(words)}"
    note = f"Refunded {part} ({refund['refund_id']}), {noted}."
    return note, f"{reply} {statement}"


def from_our_team(words: str) -> str:
    """An approver's words for the customer, passed on as they wrote them ("" for none)."""
    return f" A note from our team: {sentence(words)}" if words else ""


def not_refunded(order_id: str, name: str, refund: dict) -> tuple[str, str]:
    """The note and the reply of a refund not made. A person's rejection says only the reason
    they gave for the customer (the result carries nothing else); a refusal by the order's limit
    says the order's refunds already reach what was paid; a failure says it could not be made."""
    why = str(refund.get("reason") or "").strip().rstrip(".")  # one full stop, not ".."
    if refund.get("error") == "rejected" and why.startswith("refused:"):
        note = f"Refund not issued: {why.removeprefix('refused:').strip()}."
        said = (
            ": the refunds of this order already reach what was paid."
            if "paid" in why
            else ": it could not be made."
        )
    elif refund.get("error") == "rejected":
        note = f"Refund rejected{': ' + why if why else ''}."
        said = f": {why}." if why else "."
    else:
        why = str(refund.get("error") or "it could not be processed").strip().rstrip(".")
        note = f"Refund not issued: {why}."
        said = "."
    reply = (
        f"Hi {name}, we are sorry, but we could not approve a refund for order {order_id}{said} "
        "Reply to this message if you have questions."
    )
    return note, reply


def staff_refund(
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
        paid = paid_before(earlier.get("amount_cents"), currency, refund.get("done_at"))
        note = f"Not refunded again: this request was already refunded ({paid})."
        calls.append(("add_ticket_note", {**where, "note": note}))
    elif "refund_id" in refund:
        note, reply = refunded(order, name, {**refund, "approver_reason": words}, None, True)
        calls += [
            ("add_ticket_note", {**where, "note": note}),
            ("send_customer_reply", {**where, "message": reply}),
        ]
    else:
        note, _ = not_refunded(order_id, name, refund)
        calls.append(("add_ticket_note", {**where, "note": note}))
    return ScriptedTurn(text="Noting the refund by hand on the ticket.", tool_calls=calls)
