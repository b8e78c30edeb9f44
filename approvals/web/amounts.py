"""A call's amount on its card: which argument it is and in which currency, shown and edited in
that currency ("12.50 USD"), never in minor units.

The tool says which argument is its amount (`amount_arg`, in minor units: cents) and where its
currency is: an argument it names (`currency_arg`), else its context's `currency` (the demo's
refund: the order's), else what the run gathered (a lookup's `currency`, the run's input). With
no currency found the amount stays an integer in minor units, as the API takes it. The edit
form's amount field then says so with a hidden `unit_<name>` field (its currency), so the form
is read back in the unit it was shown in (`amount_from_form`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentruns.registry import Tool
from agentruns.registry.edits import Edit
from agentruns.runtime.values.money import BadAmount, format_cents, major_text, parse_major
from agentruns.selectors.calls import CURRENCY_KEYS, first_text
from approvals.errors import EditNotAllowed

_CURRENCY = re.compile(r"^[A-Z]{3}$")


@dataclass(frozen=True)
class Money:
    """The call's amount argument and its currency."""

    arg: str
    currency: str

    def show(self, cents: Any) -> str:
        """ "295.44 USD" (anything that is not a number as it is)."""
        if isinstance(cents, int | float) and not isinstance(cents, bool):
            return format_cents(cents, self.currency)
        return str(cents)

    def field_attrs(self, low: float | None, high: float | None) -> dict[str, str]:
        """The amount input's attributes, in the currency's major unit."""
        attrs = {"step": "0.01", "inputmode": "decimal"}
        attrs.update({k: major_text(v) for k, v in (("min", low), ("max", high)) if v is not None})
        return attrs

    def hint(self, edit: Edit, requested: Any) -> str:
        """ "may only be lowered: from 0.01 up to 295.44 USD (the requested value)"."""
        return edit.human(requested, show=lambda v: format_cents(v), unit=self.currency)


def currency_of(tool: Tool | None, args: dict, context: dict | None, sources: list[dict]) -> str:
    """Where the call's currency is: the tool's `currency_arg`, its context's `currency`, then
    the run's facts (`sources`, newest first). "" when none says."""
    if tool is not None and tool.currency_arg:
        named = args.get(tool.currency_arg)
        if isinstance(named, str) and named:
            return named
    declared = (context or {}).get("currency")
    if isinstance(declared, str) and declared:
        return declared
    return first_text(sources, CURRENCY_KEYS) or ""


def money_of(tool: Tool | None, currency: str) -> Money | None:
    """The tool's amount in `currency` (None: no amount argument, or no currency known)."""
    if tool is None or not tool.amount_arg or not currency:
        return None
    return Money(tool.amount_arg, currency)


def amount_from_form(name: str, raw: str, unit: str, edit: Edit | None, requested: Any) -> int:
    """The amount typed in the form (in `unit`'s major unit) as minor units, within the edit
    policy's bounds; EditNotAllowed says what is wrong in that currency."""
    currency = unit if _CURRENCY.match(unit) else ""
    try:
        cents = parse_major(raw)
    except BadAmount:
        raise EditNotAllowed(
            name,
            "type",
            f"edit refused: {name} must be an amount like 12.50 {currency} (got {raw})",
        ) from None
    if edit is None:
        return cents
    money = Money(name, currency)
    low, high = edit.limits(requested)
    if low is not None and cents < low:
        message = f"must be at least {money.show(low)}"
        rule = "minimum" if edit.rule != "at_least_requested" else edit.rule
    elif high is not None and cents > high:
        message = f"must be at most {money.show(high)}"
        rule = "maximum" if edit.rule != "at_most_requested" else edit.rule
    else:
        return cents
    raise EditNotAllowed(
        name, rule, f"edit refused: {name} {message} ({money.hint(edit, requested)})"
    )
