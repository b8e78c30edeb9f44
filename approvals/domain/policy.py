"""Who may decide what (DESIGN.md 4.6): separation of duties, approvers' limits, edit policies.

Deciding at all needs `approvals.decide_approval` and `approvals.view_approval` (the doors check
the first, `check_may_decide` both, for every door). Then:
- the run's starter never approves an item that needs more than one approver (403); rejecting
  is always open to deciders: it is the safe direction, and any rejection ends the item;
- a person approves at most once per round (409: another approver must do it);
- an approver may approve at most their limit, in the tool's `amount_arg`: superusers have none;
  others the highest limit any of their groups sets for the tool, as frozen in the run's
  permission snapshot, else the snapshot's default (AGENTRUNS_APPROVER_LIMIT_CENTS at start)
  (403: lower the amount, or ask someone with a higher limit);
- limits that add up (domain/limits.py): the approver's total per day and the tool's own limit
  (an order's refunds against what was paid), refused with the figures;
- edited arguments must keep to the tool's edit policy and schema (400, naming the field and the
  rule); fields the approver never saw (redacted) stay as requested.
"""

from __future__ import annotations

from typing import Any

from agentruns.conf import conf
from agentruns.registry import Tool
from agentruns.registry.deployed import deployed_tool
from agentruns.registry.edits import EditRefused, same_value
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.redaction import MASK
from approvals.domain import limits
from approvals.errors import AlreadyGiven, DecisionError, EditNotAllowed, NotAllowed, NotRunnable
from approvals.models import Approval

DECIDE_PERMISSION = "approvals.decide_approval"
VIEW_PERMISSION = "approvals.view_approval"


def check_may_decide(user: Any) -> None:
    """Deciding (or claiming, which shows the full arguments) needs both rights: nobody decides
    what they may not see. Every door's decision comes through here (services, claims, bulk).
    `None` is the system (the sweeper's expiry), which needs no rights."""
    if user is not None and not (
        user.has_perm(DECIDE_PERMISSION) and user.has_perm(VIEW_PERMISSION)
    ):
        raise NotAllowed(
            f"permission denied: deciding needs {DECIDE_PERMISSION} and {VIEW_PERMISSION}",
            code="permission_denied",
        )


def is_starter(approval: Approval, user: Any) -> bool:
    uid = getattr(user, "pk", None)
    return bool(uid and approval.run.created_by_id == uid)


def check_approval(approval: Approval, user: Any, edited: Any) -> tuple[dict, Tool]:
    """May `user` approve `approval`, with `edited` laid over its current proposal? Returns the
    arguments approved and the deployed tool. What the rules need is gathered first, the
    deployed code last, asked everything at once (can the call run; does the edit keep to the
    tool's policy and schema); the rules are then applied in their order: the call can run
    (409), the starter and once per round (403, 409), the edit (422 when it is no JSON object,
    400 outside the policy), the approver's limit (403)."""
    args = _proposal(approval, edited)
    starter = approval.is_multi and is_starter(approval, user)
    uid = getattr(user, "pk", None)
    mine = next((d for d in approval.current_approvals() if uid and d.user_id == uid), None)
    permission = approval.run.tool_permission(approval.tool)
    tool, why = deployed_tool(approval.agent, approval.tool, approval.effective_args)
    refused: EditRefused | None = None
    if tool is not None and not why and args is not None and edited not in (None, {}):
        # the edit against the tool's policy, relative to what the agent requested: a refusal
        # is kept, to be raised in its turn
        try:
            args = tool.check_edit(approval.requested_args, args)
        except EditRefused as exc:
            refused = exc
    if why or tool is None:
        raise NotRunnable(why, code="not_runnable")
    if starter:
        raise NotAllowed(
            f"you started this run, and this call needs {approval.approvals_required} approvers "
            "other than its starter: someone else must approve it (you may still reject it)",
            code="starter_may_not_approve",
        )
    if mine is not None:
        raise AlreadyGiven(
            f"you already approved this at {mine.decided_at.isoformat(timespec='seconds')}: it "
            f"needs {approval.approvals_required - approval.approvals_given} more approval(s) "
            "from someone else",
            code="already_given",
        )
    if args is None:
        raise DecisionError("edited arguments must be a JSON object")
    if refused is not None:
        raise EditNotAllowed(refused.field, refused.rule, f"edit refused: {refused}")
    amount = amount_of(approval, tool, args)
    limit = limit_of(permission, user)
    if amount is not None and limit is not None and amount > limit:
        # amounts and limits are in minor units (AGENTRUNS_APPROVER_LIMIT_CENTS)
        raise NotAllowed(
            f"{format_cents(amount)} is above your approval limit of {format_cents(limit)}: lower "
            f"{_amount_name(approval, tool)}, or ask someone with a higher limit to approve",
            code="above_limit",
        )
    if amount is not None:
        limits.check_daily_limit(user, amount)
    limits.check_tool_limit(approval, tool, args)
    return args, tool


def _amount_name(approval: Approval, tool: Tool) -> str | None:
    """The argument that is the call's amount (`@tool(amount_arg=)`), as frozen in the run's
    snapshot, else as deployed."""
    name = approval.run.tool_permission(approval.tool).get("amount_arg")
    return tool.amount_arg if name is None else name


def amount_of(approval: Approval, tool: Tool, args: dict) -> int | float | None:
    """The call's amount in `args` (None: the tool has none, or it is not a number)."""
    name = _amount_name(approval, tool)
    amount = args.get(name) if name else None
    if not isinstance(amount, int | float) or isinstance(amount, bool):
        return None
    return amount


def _proposal(approval: Approval, edited: Any) -> dict | None:
    """The current proposal with `edited` laid over it (None: `edited` is no JSON object)."""
    current = approval.effective_args
    if edited is None or edited == {}:
        return current
    if not isinstance(edited, dict):
        return None
    hidden = set(approval.hidden_fields)
    # an echo of the masked value of a field the approver never saw is not an edit
    edited = {k: v for k, v in edited.items() if not (k in hidden and v == MASK)}
    return {**current, **edited}


def _user_groups(user: Any) -> set[str]:
    cached = getattr(user, "_approval_groups", None)
    if cached is None:
        pk = getattr(user, "pk", None)
        cached = set(user.groups.values_list("name", flat=True)) if pk else set()
        user._approval_groups = cached
    return cached


def approver_limit(approval: Approval, user: Any) -> int | None:
    """The most `user` may approve on this item's tool (None: no limit)."""
    return limit_of(approval.run.tool_permission(approval.tool), user)


def limit_of(permission: dict, user: Any) -> int | None:
    """The most `user` may approve under a run's snapshot entry for a tool (None: no limit)."""
    if getattr(user, "is_superuser", False):
        return None
    limits = permission.get("limits")
    if limits is None:  # a run from before snapshots: today's default
        return conf.APPROVER_LIMIT_CENTS or None
    mine = [v for g, v in (limits.get("groups") or {}).items() if g in _user_groups(user)]
    if mine:
        return max(mine)
    return limits.get("default") or None


def is_edit(approval: Approval, args: dict) -> bool:
    """Does approving `args` change the current proposal (and so start a new round)?"""
    return not same_value(args, approval.effective_args)


def waiting_for(approval: Approval) -> str:
    """Who may still decide, in words, for the inbox card."""
    needed = approval.approvals_required - approval.approvals_given
    if needed <= 0 or not approval.is_multi:
        return ""
    excluded = []
    starter = approval.run.created_by
    if starter is not None:
        excluded.append(f"{actor_name(starter)} (started the run)")
    excluded += [f"{d.username} (approved)" for d in approval.current_approvals()]
    others = f", except {', '.join(excluded)}" if excluded else ""
    return f"{needed} more approval{'s' if needed > 1 else ''} from anyone who may decide{others}"
