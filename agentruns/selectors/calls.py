"""A tool call in words, for the pages people work in: "refund 327.32 USD to Jun Sato".

The runtime knows nothing of customers or orders, so the words come from what the run itself
gathered: the call's arguments, the results of its earlier tool steps (a lookup's
`customer_name` and `currency`) and its input, newest first (`facts`). The tool says what a call
does (`label`, a verb phrase: "refund"; default its name in words) and which argument is its
amount (`amount_arg`, in minor units) in which currency (`currency_arg`, else the facts). The
inbox's cards and the run page read the same facts with these helpers, and show a value that
is no plain text (a record, a list, an amount, a moment) in a line of words (`value_in_words`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agentruns.registry import Tool, UnknownTool, get_tool
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import moment_text

CUSTOMER_KEYS = ("customer_name", "customer", "name")
CURRENCY_KEYS = ("currency",)
ORDER_KEYS = ("order_id",)


def first_text(sources: Iterable[Mapping], keys: tuple[str, ...]) -> str | None:
    """The first non-empty string or integer under `keys` in `sources`, as text."""
    for source in sources:
        for key in keys:
            value = source.get(key)
            if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
                return str(value)
    return None


def facts(arguments: Any, earlier_results: Iterable[Any], run_input: Any) -> list[Mapping]:
    """What a call's words may read, newest first: its arguments, the results of the run's
    earlier tool steps (newest first), the run's input."""
    sources = [arguments, *earlier_results, run_input]
    return [s for s in sources if isinstance(s, Mapping)]


def deployed_tool(name: str) -> Tool | None:
    try:
        return get_tool(name)
    except UnknownTool:
        return None


def tool_label(name: str) -> str:
    """What a call of the tool does: its `label`, else its name in words ("hand over")."""
    tool = deployed_tool(name)
    if tool is not None and tool.label:
        return tool.label
    return name.replace("_", " ").replace(".", " ").strip()


def call_amount(name: str, arguments: Any, sources: list[Mapping], currency: str = "") -> str:
    """The call's amount in its currency ("327.32 USD"), "" when it has none (or none known)."""
    tool = deployed_tool(name)
    if tool is None or not tool.amount_arg or not isinstance(arguments, Mapping):
        return ""
    cents = arguments.get(tool.amount_arg)
    if not isinstance(cents, int) or isinstance(cents, bool):
        return ""
    if not currency and tool.currency_arg:
        named = arguments.get(tool.currency_arg)
        currency = named if isinstance(named, str) else ""
    currency = currency or first_text(sources, CURRENCY_KEYS) or ""
    return format_cents(cents, currency) if currency else ""


def call_in_words(name: str, arguments: Any, sources: list[Mapping], currency: str = "") -> str:
    """ "refund 327.32 USD to Jun Sato", "hand over for Hana Okafor", "send customer reply"."""
    label = tool_label(name)
    amount = call_amount(name, arguments, sources, currency)
    customer = first_text(sources, CUSTOMER_KEYS)
    if amount and customer:
        return f"{label} {amount} to {customer}"
    if amount:
        return f"{label} {amount}"
    if customer:
        return f"{label} for {customer}"
    return label


def argument_label(name: str) -> str:
    """An argument or input field as people name it: "order_id" -> "Order", "amount_cents" ->
    "Amount", "customer_email" -> "Customer email"."""
    words = name
    for suffix in ("_cents", "_id", "_ids"):
        if words.endswith(suffix) and len(words) > len(suffix):
            words = words[: -len(suffix)] + ("s" if suffix == "_ids" else "")
            break
    words = words.replace("_", " ").replace("-", " ").strip()
    return words[:1].upper() + words[1:] if words else name


def moment_or_text(value: Any) -> str:
    """An ISO 8601 moment as people read it ("Dec 3, 14:02"); anything else as it is."""
    if not isinstance(value, str) or "T" not in value:
        return str(value)
    return moment_text(value) or value


def value_in_words(name: str, value: Any, currency: str = "") -> str:
    """A value in a line people read: an amount (`*_cents`) in its currency, yes or no, a moment
    in words, a record's ids and names as they are with its amounts and yes/no answers saying
    what they are ("ORD-1041, Ada Lovelace, blender, paid 374.63 USD"), a list with "; "."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name.endswith("_cents") and isinstance(value, int | float):
        return format_cents(value, currency)
    if isinstance(value, Mapping):
        parts = [
            f"{argument_label(str(k)).lower()} {value_in_words(str(k), v, currency)}"
            if str(k).endswith("_cents") or isinstance(v, bool)
            else value_in_words(str(k), v, currency)
            for k, v in value.items()
        ]
        return ", ".join(parts) or "—"
    if isinstance(value, list):
        return "; ".join(value_in_words(name, item, currency) for item in value) or "none"
    if value is None:
        return "—"
    return moment_or_text(value)
