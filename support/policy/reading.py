"""What the customer's message asks for, read as the offline model reads it: the amount they name
(`requested_amount_cents`), and whether they ask for anything at all (`asks_for_nothing`: a
question, or nothing, which the agent answers instead of refunding)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

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
