"""Amounts in minor units (cents) as people read them and type them: one formatter for the inbox
cards, the mails, the admin, the approver-limit message and the demo agent's replies, and the one
parser of an amount typed in a currency's major unit (the inbox's edit of a tool's amount)."""

from __future__ import annotations

import re


def format_cents(cents: int | float, currency: str = "") -> str:
    """459900 -> "4,599.00" ("4,599.00 EUR" with a currency). Exact for any integer: a float
    division would round large amounts (and overflow past 10**308)."""
    if isinstance(cents, int):
        whole, part = divmod(abs(cents), 100)
        text = f"{'-' if cents < 0 else ''}{whole:,}.{part:02d}"
    else:
        text = f"{cents / 100:,.2f}"
    return f"{text} {currency}" if currency else text


class BadAmount(ValueError):
    """Text that is not an amount in a currency's major unit ("12.50")."""


_MAJOR = re.compile(r"^(?P<whole>\d{1,15})(?:[.,](?P<part>\d{1,2}))?$")
_GROUPED = re.compile(r"^\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?$")


def parse_major(text: str) -> int:
    """An amount typed in a currency's major unit as minor units (cents): "12.50", "12,50" (a
    decimal comma), "1,234.50" (thousands), "12" -> 1250, 1250, 123450, 1200. Exact (no float);
    BadAmount for anything else, a sign or more than two decimals included."""
    text = text.strip()
    if _GROUPED.match(text):
        text = text.replace(",", "")
    match = _MAJOR.match(text)
    if match is None:
        raise BadAmount(f"{text!r} is not an amount like 12.50")
    part = (match["part"] or "").ljust(2, "0")
    return int(match["whole"]) * 100 + int(part or 0)


def major_text(cents: int | float) -> str:
    """Minor units as the plain text of an amount input: 1250 -> "12.50" (no separators)."""
    if isinstance(cents, int):
        whole, part = divmod(abs(cents), 100)
        return f"{'-' if cents < 0 else ''}{whole}.{part:02d}"
    return f"{cents / 100:.2f}"
