"""Decisions on parked runs (DESIGN.md invariants 4 and 5).

One function per decision (`approve`, `reject`, `reconcile`). Each is one
transaction: a compare-and-set on the approval (`status=pending`), the step and run changes, the
audit event `approval.decided` on the run's timeline (who, when, requested and approved
arguments, the diff), and the worker's doorbell, rung on commit. A second decision on the same
item changes nothing and raises `AlreadyDecided` naming who decided and when.

The UI (views.py) and the JSON API (api.py) call these, so the rules are the same everywhere; the
compare-and-set itself (`parking.settle`) is shared with the sweeper's expiry.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import ToolArgumentsError, UnknownTool, get_tool
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.ids import actor_name
from agentruns.runtime.nudges import nudge_on_commit
from agentruns.runtime.redaction import redact_fields
from agentruns.runtime.transitions import RunChange, aborted, apply, resume_parked
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from approvals.parking import (
    AlreadyDecided,
    DecisionError,
    args_diff,
    decided_event,
    refuse_if_decided,
    reject_parked,
    settle,
    withdraw_approvals,
)

__all__ = ["AlreadyDecided", "DecisionError", "approve", "reconcile", "reject"]


def validate_edited_args(approval: Approval, edited: dict) -> dict:
    """The requested arguments with `edited` laid over them, checked against the tool's schema."""
    if not isinstance(edited, dict):
        raise DecisionError("edited arguments must be a JSON object")
    try:
        tool = get_tool(approval.tool)
    except UnknownTool:
        raise DecisionError(
            f"the tool {approval.tool} is no longer registered; cannot edit"
        ) from None
    merged = {**approval.requested_args, **edited}
    try:
        return tool.validate(merged)
    except ToolArgumentsError as exc:
        raise DecisionError(f"the edited arguments are not valid: {exc}") from None


def approver_limit_cents(user: Any) -> int | None:
    """The most this user may approve (None: no limit). Superusers (leads) have none."""
    limit = conf.APPROVER_LIMIT_CENTS
    if limit <= 0 or getattr(user, "is_superuser", False):
        return None
    return limit


def check_limit(user: Any, args: dict) -> None:
    limit = approver_limit_cents(user)
    amount = args.get("amount_cents")
    if limit is not None and isinstance(amount, int) and amount > limit:
        raise DecisionError(
            f"{amount / 100:,.2f} is above your approval limit of {limit / 100:,.2f}: "
            "lower the amount or ask a lead to approve",
            code="above_limit",
        )


def approve(
    approval_id: int, *, user: Any, edited_args: dict | None = None, reason: str = ""
) -> Approval:
    """Approve, optionally with edited arguments (validated against the tool's schema).

    The step keeps its idempotency key and runs with the approved arguments; the requested ones
    stay on the approval, the full approved set goes to `edited_args` when it differs.
    """
    with transaction.atomic():
        current = Approval.objects.select_related("run", "step", "decided_by").get(id=approval_id)
        # a late click must learn who decided, not that its edits are invalid
        refuse_if_decided(current, ApprovalKind.APPROVAL)
        args = current.requested_args
        if edited_args:
            args = validate_edited_args(current, edited_args)
        check_limit(user, args)
        edited = args if args != current.requested_args else None
        approval = settle(
            approval_id,
            ApprovalKind.APPROVAL,
            user,
            status=ApprovalStatus.APPROVED,
            edited_args=edited,
            reason=reason.strip(),
        )
        step = approval.step
        step.arguments, step.approved, step.status = args, True, StepStatus.PENDING
        step.save(update_fields=["arguments", "approved", "status"])
        hidden = approval.hidden_fields
        requested = redact_fields(approval.requested_args, hidden)
        approved = redact_fields(args, hidden)
        resume_parked(
            approval.run_id,
            [
                decided_event(
                    approval,
                    user,
                    "approved",
                    requested=requested,
                    approved=approved,
                    diff=args_diff(requested, approved) if edited is not None else {},
                    edited=edited is not None,
                )
            ],
        )
    return approval


def reject(approval_id: int, *, user: Any, reason: str = "") -> Approval:
    """Reject; the agent receives `{"error": "rejected", "reason": ...}` as the tool's result."""
    with transaction.atomic():
        return reject_parked(approval_id, user=user, reason=reason.strip() or "rejected by staff")


RESOLUTIONS = ("happened", "retry", "abort")


def reconcile(
    approval_id: int, *, user: Any, resolution: str, result: Any = None, reason: str = ""
) -> Approval:
    """Staff say what happened to a call whose outcome is unknown (DESIGN.md 4.4).

    happened: the step succeeds with the given result (or a marker) and the run continues;
    retry: the step runs again (same idempotency key); abort: the run fails, nothing more runs.
    """
    if resolution not in RESOLUTIONS:
        raise DecisionError(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    who = actor_name(user) or "staff"
    with transaction.atomic():
        approval = settle(
            approval_id,
            ApprovalKind.RECONCILIATION,
            user,
            status=ApprovalStatus.RESOLVED,
            resolution=resolution,
            resolution_result=result if resolution == "happened" else None,
            reason=reason.strip(),
        )
        step, now = approval.step, timezone.now()
        run = Run.objects.select_for_update().get(id=approval.run_id)
        events: list[EventSpec] = [
            decided_event(
                approval,
                user,
                f"reconciled: {resolution}",
                resolution=resolution,
                requested=redact_fields(approval.requested_args, approval.hidden_fields),
                result=result if resolution == "happened" else None,
            ),
        ]
        if resolution == "happened":
            step.status, step.finished_at = StepStatus.SUCCEEDED, now
            step.result = (
                result if result is not None else {"reconciled": True, "happened": True, "by": who}
            )
            step.error = f"outcome unknown; {who} confirmed it happened"
        elif resolution == "retry":
            step.status, step.finished_at = StepStatus.PENDING, None
            step.error = f"outcome unknown; {who} confirmed it did not happen, retrying"
        else:
            step.status, step.finished_at = StepStatus.FAILED, now
            step.error = f"aborted by {who}: outcome unknown"
        step.save(update_fields=["status", "result", "finished_at", "error"])
        if resolution != "abort":
            resume_parked(run.id, events)
            return approval
        # abort: the run ends here; steps planned after this one never run
        Step.objects.filter(
            run=run,
            index__gt=step.index,
            status__in=[StepStatus.PENDING, StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN],
        ).update(status=StepStatus.SKIPPED, finished_at=now)
        withdrawn = withdraw_approvals(run, reason=f"run aborted by {who}")
        events += [(EventType.APPROVAL_WITHDRAWN, {"approval": a}) for a in withdrawn]
        change = aborted(f"aborted by {who} after an unknown outcome of {step.tool}").after(*events)
        if run.status != RunStatus.WAITING:  # (cancelled meanwhile): only the audit events
            change = RunChange({}, events)
        apply(run.id, change)
        nudge_on_commit(run.id, 0, inbox=True)
    return approval
