"""What a person needs to decide an inbox item without clicking away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from agentruns.redaction import redact_fields
from agentruns.registry import get_tool

from .models import Approval


@dataclass
class Card:
    approval: Approval
    args: dict
    fields: list[dict]
    waited_seconds: float
    reason_given: str
    amount: str | None
    order_id: str | None
    customer: str | None


def card_for(approval: Approval) -> Card:
    run = approval.run
    hidden = run.tool_snapshot.get(approval.tool, {}).get("redact", [])
    args = redact_fields(approval.effective_args, hidden)
    try:
        props = get_tool(approval.tool).parameters.get("properties", {})
    except LookupError:
        props = {}
    fields = [
        {
            "name": name,
            "type": prop.get("type", "string"),
            "value": args.get(name, ""),
            "editable": name not in hidden,
        }
        for name, prop in props.items()
    ]
    amount_cents = args.get("amount_cents")
    currency = run.input.get("currency", "USD") if isinstance(run.input, dict) else "USD"
    return Card(
        approval=approval,
        args=args,
        fields=fields,
        waited_seconds=(timezone.now() - approval.created_at).total_seconds(),
        reason_given=str(args.get("reason", "")),
        amount=f"{amount_cents / 100:,.2f} {currency}" if isinstance(amount_cents, int) else None,
        order_id=_get(args, run.input, "order_id"),
        customer=_get({}, run.input, "customer"),
    )


def _get(args: dict, run_input: Any, key: str) -> str | None:
    if key in args:
        return str(args[key])
    if isinstance(run_input, dict) and key in run_input:
        return str(run_input[key])
    return None
