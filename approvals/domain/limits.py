"""Limits that add up, checked when a person approves a call (policy.check_approval):

- the approver's total per day (AGENTRUNS_APPROVER_DAILY_LIMIT_CENTS, 0 off, in the tools'
  `amount_arg`; superusers have none, as for the approver limit): their approvals since
  midnight (TIME_ZONE), one ApprovalDecision each with the amount it approved, plus this one.
  One person's concurrent decisions queue on their user row, so two tabs cannot both pass;
- the tool's own limit (`@tool(limit=)`, agentruns/registry/operations.py): the demo's refunds
  of an order against what was paid. Skipped for a call whose operation key is used: it will not
  be made (its model is answered "already done"), so it adds nothing. The executor checks the
  limit again right before the call runs, while the call holds its key.

Either refusal is `LimitExceeded` with the sentence and the figures.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Sum
from django.utils import timezone

from agentruns.registry import OperationKeyError, OverLimit, Tool
from agentruns.registry.operations import over_limit
from agentruns.runtime.operations.executions import key_state
from agentruns.runtime.operations.gate import key_for
from agentruns.runtime.values.money import format_cents
from approvals.conf import conf
from approvals.errors import LimitExceeded
from approvals.models import Approval, ApprovalDecision, DecisionKind


def approved_today(user: Any) -> int:
    """What `user` approved since midnight, in the tools' amount arguments."""
    midnight = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    total = ApprovalDecision.objects.filter(
        user=user, decision=DecisionKind.APPROVE, decided_at__gte=midnight
    ).aggregate(total=Sum("amount"))["total"]
    return int(total or 0)


def check_daily_limit(user: Any, amount: int | float) -> None:
    limit = conf.APPROVER_DAILY_LIMIT_CENTS
    if not limit or getattr(user, "is_superuser", False) or not getattr(user, "pk", None):
        return
    # one person's decisions one at a time: the sum below cannot be read by two of them at once
    get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("pk").first()
    before = approved_today(user)
    total = before + amount
    if total <= limit:
        return
    raise LimitExceeded(
        f"approving {format_cents(amount)} would bring your approvals today to "
        f"{format_cents(total)}, above your daily limit of {format_cents(limit)}: ask another "
        "approver",
        "over_daily_limit",
        {
            "amount": amount,
            "approved_today": before,
            "total": total,
            "daily_limit": limit,
        },
        status=403,
    )


def will_be_made(approval: Approval, tool: Tool, args: dict) -> bool:
    """Would the call run if approved now (False: its operation key is used, so it is answered
    "already done" instead)? A key that cannot be computed is the executor's to refuse."""
    try:
        key = key_for(approval.run, tool, args)
    except OperationKeyError:
        return True
    return key is None or key_state(key).status != "used"


def check_tool_limit(approval: Approval, tool: Tool, args: dict) -> None:
    if tool.limit is None or not will_be_made(approval, tool, args):
        return
    try:
        over = over_limit(tool.name, tool.limit, args)
    except Exception as exc:  # fail closed: a limit nobody could check approves nothing
        over = OverLimit(f"{tool.name}: its limit could not be checked ({type(exc).__name__})")
    if over is not None:
        raise LimitExceeded(f"approving is refused: {over.message}", "over_limit", over.figures)
