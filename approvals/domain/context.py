"""What an approver sees beside a pending call, across runs (the card and the API's `context`):

- what the call's tool declares (`@tool(context=)`, agentruns/registry/operations.py), from the
  current proposal: for the demo's refund, the order, its refunds so far and their totals;
- with an operation key, under `operation`: the key's executions and allowances and what the
  call meets if approved now (`status`: free, it runs; held, it waits for the call holding the
  key; used, it is answered "already done"), and under `pending` the other pending items of the
  same key in any run (with `pending_total` in the tool's `amount_arg`).

Only for pending approvals: a decided item's context would show the world as it is now, not as
the approver saw it. The runs' own pieces cost two queries per page (the keys' rows, the other
items); the tools' declarations are the domain's own reads.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agentruns.models import OperationAllowance, OperationExecution
from agentruns.registry import get_tool, has_tool
from agentruns.registry.operations import contexts_of
from agentruns.runtime.values.redaction import redact_fields
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.operations import key_payload, key_states
from approvals.models import Approval, ApprovalKind, ApprovalStatus

# what a tool's context is shown beside: a call waiting for approval, and a hand-over (the
# person who picks it up reads the order the run was about)
CONTEXT_KINDS = (ApprovalKind.APPROVAL, ApprovalKind.HANDOVER)


def contexts(approvals: list[Approval]) -> dict[int, dict | None]:
    """Each item's context by id (None: decided, a reconciliation, or nothing declared)."""
    pending = [
        a for a in approvals if a.status == ApprovalStatus.PENDING and a.kind in CONTEXT_KINDS
    ]
    keys = sorted({a.operation_key for a in pending if a.operation_key})
    states = key_states(keys)
    others = _pending_by_key(keys)
    declared = _declared_contexts(pending)
    found: dict[int, dict | None] = {a.id: None for a in approvals}
    for approval in pending:
        found[approval.id] = _context(approval, states, others, declared.get(approval.id))
    return found


def _declared_contexts(pending: list[Approval]) -> dict[int, dict]:
    """What each item's tool declares for its current proposal, by item id: the calls of one
    tool read together (`contexts_of`: one read for the page's refunds, not one per card)."""
    by_tool: dict[str, list[Approval]] = defaultdict(list)
    for approval in pending:
        tool = get_tool(approval.tool) if has_tool(approval.tool) else None
        if tool is not None and tool.context:
            by_tool[approval.tool].append(approval)
    found: dict[int, dict] = {}
    for name, items in by_tool.items():
        calls = [a.effective_args for a in items]
        for approval, context in zip(
            items, contexts_of(name, get_tool(name).context, calls), strict=True
        ):
            found[approval.id] = context
    return found


def _context(
    approval: Approval, states: dict, others: dict[str, list[Approval]], declared: dict | None
) -> dict | None:
    tool = get_tool(approval.tool) if has_tool(approval.tool) else None
    context = dict(declared) if declared else {}
    key = approval.operation_key
    if key:
        context["operation"] = key_payload(states[key])
        items = [a for a in others.get(key, []) if a.id != approval.id]
        amount_arg = tool.amount_arg if tool is not None else None
        context["pending"] = [_item(a, amount_arg) for a in items]
        if amount_arg:
            amounts = [item["amount"] for item in context["pending"]]
            context["pending_total"] = sum(a for a in amounts if isinstance(a, int | float))
    return context or None


def _pending_by_key(keys: list[str]) -> dict[str, list[Approval]]:
    """The pending items of these keys, oldest first, in one query."""
    found: dict[str, list[Approval]] = defaultdict(list)
    if not keys:
        return found
    rows = (
        Approval.objects.filter(
            status=ApprovalStatus.PENDING, kind=ApprovalKind.APPROVAL, operation_key__in=keys
        )
        .only(
            "id", "run_id", "tool", "operation_key", "requested_args", "edited_args", "created_at"
        )
        .order_by("created_at", "id")
    )
    for row in rows:
        found[row.operation_key].append(row)
    return found


def _item(approval: Approval, amount_arg: str | None) -> dict[str, Any]:
    """Another pending item, its arguments masked by the deployed tool's `redact`."""
    args = approval.effective_args
    hidden = get_tool(approval.tool).redact if has_tool(approval.tool) else ()
    amount = args.get(amount_arg) if amount_arg else None
    return {
        "approval": approval.id,
        "run_id": str(approval.run_id),
        "args": redact_fields(args, hidden),
        "amount": amount
        if isinstance(amount, int | float) and not isinstance(amount, bool)
        else None,
        "since": iso(approval.created_at),
    }


def context_for(approval: Approval) -> dict | None:
    return contexts([approval])[approval.id]


def keys_signature(approvals: list[Approval]) -> str:
    """What changes the cross-run part of these items' cards (an execution of their keys taken,
    settled or allowed): part of the inbox poll's signature, so a card shows a refund made by
    another run at the next poll. Two queries, none without keys."""
    keys = sorted({a.operation_key for a in approvals if a.operation_key})
    if not keys:
        return ""
    rows = OperationExecution.objects.filter(key__in=keys).values_list("id", "state")
    allowed = OperationAllowance.objects.filter(key__in=keys).values_list("id", flat=True)
    return f"{sorted(rows)}{sorted(allowed)}"
