"""A pending call's cross-run context (approvals/domain/context.py) as compact lines for its
card: the tool's own facts (amounts in `*_cents` fields in the context's `currency`), what the
call meets under its operation key, and the other pending items of that key. Plain strings: the
template escapes them like any other text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import ago_text, moment_text
from agentruns.selectors.calls import argument_label

ENGINE_KEYS = ("operation", "pending", "pending_total", "currency", "error")
MAX_TEXT = 400  # one fact's line; a tool's huge context never floods the card


@dataclass
class ContextView:
    facts: list[tuple[str, str]] = field(default_factory=list)
    error: str = ""
    key: str = ""
    key_status: str = ""  # free, held or used
    key_line: str = ""
    pending: list[str] = field(default_factory=list)
    pending_total: str = ""

    @property
    def may_allow(self) -> bool:
        """The call would be answered "already done": a lead may allow one more execution."""
        return self.key_status == "used"


def context_view(context: dict | None) -> ContextView | None:
    if not context:
        return None
    currency = context.get("currency") if isinstance(context.get("currency"), str) else ""
    view = ContextView(error=str(context.get("error") or ""))
    for name, value in context.items():
        if name not in ENGINE_KEYS:
            view.facts.append((_label(name), _text(name, value, currency)[:MAX_TEXT]))
    operation = context.get("operation")
    if isinstance(operation, dict):
        view.key, view.key_status = operation.get("key", ""), operation.get("status", "")
        view.key_line = _key_line(operation, currency)
    for item in context.get("pending") or []:
        amount = item.get("amount")
        shown = _amount(amount, currency) if amount is not None else ""
        view.pending.append(
            " · ".join(
                part
                for part in (
                    f"#{item.get('approval')}",
                    shown,
                    f"waiting since {ago_text(item.get('since')) or _when(item.get('since'))}",
                )
                if part
            )
        )
    if context.get("pending_total") and view.pending:
        view.pending_total = _amount(context["pending_total"], currency)
    return view


def _label(name: str) -> str:
    return argument_label(name).lower()


def _amount(value: Any, currency: str) -> str:
    return format_cents(value, currency) if isinstance(value, int | float) else str(value)


def _when(value: Any) -> str:
    """An ISO 8601 moment as people read it ("Dec 3, 14:02"); anything else as it is."""
    if not isinstance(value, str) or "T" not in value:
        return str(value)
    return moment_text(value) or value


def _text(name: str, value: Any, currency: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name.endswith("_cents") and isinstance(value, int | float):
        return format_cents(value, currency)
    if isinstance(value, dict):
        # a record in a line: its ids and names speak for themselves, amounts and yes/no
        # answers say what they are ("ORD-1041, Ada Lovelace, blender, paid 374.63 USD")
        parts = [
            f"{_label(k)} {_text(k, v, currency)}"
            if k.endswith("_cents") or isinstance(v, bool)
            else _text(k, v, currency)
            for k, v in value.items()
        ]
        return ", ".join(parts) or "—"
    if isinstance(value, list):
        return "; ".join(_text(name, item, currency) for item in value) or "none"
    if value is None:
        return "—"
    return _when(value)


def _key_line(operation: dict, currency: str) -> str:
    """What the call meets under its operation key, in words (the key itself is the card's
    `data-key`, for engineers)."""
    status = operation.get("status", "")
    live = [e for e in operation.get("executions") or [] if e.get("state") != "released"]
    allowed = operation.get("allowed", 1)
    if status == "held":
        holder = next((e for e in live if e.get("state") == "held"), {})
        return (
            f"Another run is making this call now (since {_when(holder.get('at'))}): approved, "
            "this call waits for it, then runs or is answered with its result."
        )
    if status == "used":
        done = live[-1] if live else {}
        result = done.get("result")
        what = f" ({_text('result', result, currency)[:200]})" if isinstance(result, dict) else ""
        return (
            f"Already done by another run on {_when(done.get('settled_at') or done.get('at'))}"
            f"{what}: approving will not do it again; the agent is told it was already done."
        )
    if live:
        return f"Done {len(live)} of the {allowed} times allowed: approving makes this call."
    return "Not done yet: approving makes this call."
