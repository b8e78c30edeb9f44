"""Amounts in minor units (cents) as people read them: one formatter for the inbox cards, the
mails, the admin, the approver-limit message and the demo agent's replies."""

from __future__ import annotations


def format_cents(cents: int | float, currency: str = "") -> str:
    """459900 -> "4,599.00" ("4,599.00 EUR" with a currency). Exact for any integer: a float
    division would round large amounts (and overflow past 10**308)."""
    if isinstance(cents, int):
        whole, part = divmod(abs(cents), 100)
        text = f"{'-' if cents < 0 else ''}{whole:,}.{part:02d}"
    else:
        text = f"{cents / 100:,.2f}"
    return f"{text} {currency}" if currency else text
