"""A pending call's cross-run context (approvals/domain/context.py) as compact lines for its
card: the tool's own facts (amounts in `*_cents` fields in the context's `currency`), what the
call meets under its operation key, and the other pending items of that key. Plain strings: the
template escapes them like any other text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import ago_text
from agentruns.selectors.calls import argument_label, moment_or_text, value_in_words

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
            view.facts.append((_label(name), value_in_words(name, value, currency)[:MAX_TEXT]))
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
                    f"waiting since {_since(item.get('since'))}",
                )
                if part
            )
        )
    if context.get("pending_total") and view.pending:
        view.pending_total = _amount(context["pending_total"], currency)
    return view


def _since(value: Any) -> str:
    return ago_text(value) or moment_or_text(value)


def _label(name: str) -> str:
    return argument_label(name).lower()


def _amount(value: Any, currency: str) -> str:
    return format_cents(value, currency) if isinstance(value, int | float) else str(value)


def _key_line(operation: dict, currency: str) -> str:
    """What the call meets under its operation key, in words (the key itself is the card's
    `data-key`, for engineers)."""
    status = operation.get("status", "")
    live = [e for e in operation.get("executions") or [] if e.get("state") != "released"]
    allowed = operation.get("allowed", 1)
    if status == "held":
        holder = next((e for e in live if e.get("state") == "held"), {})
        since = moment_or_text(holder.get("at"))
        return (
            f"Another run is making this call now (since {since}): approved, this call waits for "
            "it, then runs or is answered with its result."
        )
    if status == "used":
        done = live[-1] if live else {}
        result = done.get("result")
        what = (
            f" ({value_in_words('result', result, currency)[:200]})"
            if isinstance(result, dict)
            else ""
        )
        when = moment_or_text(done.get("settled_at") or done.get("at"))
        return (
            f"Already done by another run on {when}{what}: approving will not do it again; the "
            "agent is told it was already done."
        )
    if live:
        return f"Done {len(live)} of the {allowed} times allowed: approving makes this call."
    return "Not done yet: approving makes this call."
