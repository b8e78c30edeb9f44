"""Decisions on parked runs (DESIGN.md invariants 4 and 5).

Every decision is one transaction: a compare-and-set on the approval (`status=pending`), the
step and run changes, the audit events, and the doorbell for the worker. A second decision on the
same item changes nothing and raises `AlreadyDecided` naming who decided and when.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentruns.events import append_events, nudge_on_commit
from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepAttempt, StepStatus
from agentruns.registry import ToolArgumentsError, get_tool
from agentruns.services import actor_name, enqueue

from .models import Approval, ApprovalKind, ApprovalStatus


class DecisionError(Exception):
    """The decision is not acceptable as given (bad arguments, over the approver's limit)."""


class AlreadyDecided(Exception):
    def __init__(self, approval: Approval) -> None:
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = approval.decided_at.isoformat(timespec="seconds") if approval.decided_at else "earlier"
        super().__init__(f"already {approval.status} by {who} at {when}")
        self.approval = approval


# ------------------------------------------------------------------ opened by the engine
def open_approval(step: Step, agent: str) -> Approval:
    expiry = float(settings.AGENTRUNS_APPROVAL_EXPIRY_SECONDS)
    approval = Approval.objects.create(
        step=step,
        run_id=step.run_id,
        kind=ApprovalKind.APPROVAL,
        agent=agent,
        tool=step.tool,
        requested_args=step.arguments,
        expires_at=timezone.now() + timedelta(seconds=expiry) if expiry > 0 else None,
    )
    nudge_on_commit(step.run_id, 0, inbox=True)
    return approval


def open_reconciliation(step: Step, agent: str) -> Approval:
    approval, _ = Approval.objects.update_or_create(
        step=step,
        defaults={
            "run_id": step.run_id,
            "kind": ApprovalKind.RECONCILIATION,
            "status": ApprovalStatus.PENDING,
            "agent": agent,
            "tool": step.tool,
            "requested_args": step.arguments,
            "decided_by": None,
            "decided_at": None,
            "resolution": "",
            "expires_at": None,
        },
    )
    nudge_on_commit(step.run_id, 0, inbox=True)
    return approval


def withdraw_approvals(run: Run, *, reason: str) -> list[int]:
    ids = list(
        Approval.objects.filter(run=run, status=ApprovalStatus.PENDING).values_list("id", flat=True)
    )
    if ids:
        Approval.objects.filter(id__in=ids, status=ApprovalStatus.PENDING).update(
            status=ApprovalStatus.RESOLVED, resolution="withdrawn", reason=reason,
            decided_at=timezone.now(),
        )
        nudge_on_commit(run.id, 0, inbox=True)
    return ids


# ------------------------------------------------------------------ staff decisions
def _claim(approval_id: int, kind: str, user: Any, **changes: Any) -> Approval:
    """Compare-and-set pending -> decided; the loser gets AlreadyDecided."""
    now = timezone.now()
    won = Approval.objects.filter(id=approval_id, kind=kind, status=ApprovalStatus.PENDING).update(
        decided_by=user if getattr(user, "is_authenticated", False) else None, decided_at=now, **changes
    )
    approval = Approval.objects.select_related("step", "run", "decided_by").get(id=approval_id)
    if not won:
        if approval.kind != kind:
            raise DecisionError(f"this item is a {approval.kind}, not a {kind}")
        raise AlreadyDecided(approval)
    return approval


def _requeue(run: Run, events: list[tuple[str, dict]]) -> None:
    # the run was parked (waiting); a cancelled or finished run stays as it is
    requeued = Run.objects.filter(id=run.id, status=RunStatus.WAITING).update(
        status=RunStatus.QUEUED, enqueued_at=timezone.now()
    )
    if requeued:
        events.append(("run.status", {"status": RunStatus.QUEUED}))
    append_events(run.id, events)
    if requeued:
        enqueue(run.id)
    nudge_on_commit(run.id, 0, inbox=True)


def validate_edited_args(approval: Approval, edited: dict) -> dict:
    tool = get_tool(approval.tool)
    merged = {**approval.requested_args, **edited}
    try:
        return tool.validate(merged)
    except ToolArgumentsError as exc:
        raise DecisionError(str(exc)) from None


def approver_limit_cents(user: Any) -> int | None:
    limit = int(settings.AGENTRUNS_APPROVER_LIMIT_CENTS)
    if limit <= 0 or getattr(user, "is_superuser", False):
        return None
    return limit


def args_diff(before: dict, after: dict) -> dict:
    return {
        k: {"from": before.get(k), "to": after.get(k)}
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }


def approve(approval_id: int, *, user: Any, edited_args: dict | None = None, reason: str = "") -> Approval:
    with transaction.atomic():
        current = Approval.objects.get(id=approval_id)
        args = current.requested_args
        if edited_args:
            args = validate_edited_args(current, edited_args)
        limit = approver_limit_cents(user)
        amount = args.get("amount_cents")
        if limit is not None and isinstance(amount, int) and amount > limit:
            raise DecisionError(
                f"{amount / 100:.2f} is above your approval limit of {limit / 100:.2f}; "
                "ask a lead to approve"
            )
        edited = args if args != current.requested_args else None
        approval = _claim(
            approval_id, ApprovalKind.APPROVAL, user,
            status=ApprovalStatus.APPROVED, edited_args=edited, reason=reason,
        )
        step = approval.step
        step.arguments, step.approved, step.status = args, True, StepStatus.PENDING
        step.save(update_fields=["arguments", "approved", "status"])
        _requeue(
            approval.run,
            [
                (
                    "approval.decided",
                    {
                        "approval": approval.id, "step": step.index, "decision": "approved",
                        "by": actor_name(user), "reason": reason,
                        "diff": args_diff(approval.requested_args, args) if edited else {},
                    },
                ),
            ],
        )
    return approval


def reject(approval_id: int, *, user: Any, reason: str = "", status: str = ApprovalStatus.REJECTED) -> Approval:
    reason = reason.strip() or ("expired" if status == ApprovalStatus.EXPIRED else "rejected by staff")
    with transaction.atomic():
        approval = _claim(approval_id, ApprovalKind.APPROVAL, user, status=status, reason=reason)
        step = approval.step
        step.status, step.finished_at = StepStatus.REJECTED, timezone.now()
        step.error = reason
        # the model receives this as the tool's result, so it can tell the customer
        step.result = {"error": "rejected", "reason": reason}
        step.save(update_fields=["status", "finished_at", "error", "result"])
        _requeue(
            approval.run,
            [
                (
                    "approval.decided",
                    {
                        "approval": approval.id, "step": step.index, "decision": status,
                        "by": actor_name(user), "reason": reason,
                    },
                ),
            ],
        )
    return approval


def expire_due_approvals(now: Any = None) -> int:
    """Called by the sweeper: pending approvals past their expiry are rejected as "expired"."""
    now = now or timezone.now()
    due = Approval.objects.filter(
        status=ApprovalStatus.PENDING, kind=ApprovalKind.APPROVAL, expires_at__lte=now
    ).values_list("id", flat=True)[:200]
    expired = 0
    for approval_id in list(due):
        try:
            reject(approval_id, user=None, reason="expired", status=ApprovalStatus.EXPIRED)
            expired += 1
        except AlreadyDecided:
            pass
    return expired


RESOLUTIONS = ("happened", "retry", "abort")


def reconcile(approval_id: int, *, user: Any, resolution: str, result: Any = None, reason: str = "") -> Approval:
    """Staff say what happened to a call whose outcome is unknown (DESIGN.md 4.4)."""
    if resolution not in RESOLUTIONS:
        raise DecisionError(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    with transaction.atomic():
        approval = _claim(
            approval_id, ApprovalKind.RECONCILIATION, user,
            status=ApprovalStatus.RESOLVED, resolution=resolution,
            resolution_result=result, reason=reason,
        )
        step, run, now = approval.step, approval.run, timezone.now()
        events: list[tuple[str, dict]] = [
            ("approval.decided", {"approval": approval.id, "step": step.index,
                                  "decision": f"reconciled: {resolution}", "by": actor_name(user),
                                  "reason": reason}),
        ]
        if resolution == "happened":
            step.status, step.result, step.finished_at = StepStatus.SUCCEEDED, (result if result is not None else {"ok": True, "reconciled": True}), now
            StepAttempt.objects.filter(step=step, number=step.attempts).update(outcome=AttemptOutcome.SUCCEEDED)
        elif resolution == "retry":
            step.status = StepStatus.PENDING
        else:
            step.status, step.finished_at = StepStatus.FAILED, now
            step.error = f"aborted by {actor_name(user) or 'staff'}: outcome unknown"
        step.save(update_fields=["status", "result", "finished_at", "error"])
        if resolution == "abort":
            Run.objects.filter(id=run.id, status=RunStatus.WAITING).update(
                status=RunStatus.FAILED, finished_at=now, stop_reason="aborted",
                error=f"aborted by {actor_name(user) or 'staff'} after an unknown outcome of {step.tool}",
                lease_owner="", lease_expires_at=None,
            )
            events.append(("run.status", {"status": RunStatus.FAILED, "stop_reason": "aborted"}))
            append_events(run.id, events)
            nudge_on_commit(run.id, 0, inbox=True)
        else:
            _requeue(run, events)
    return approval
