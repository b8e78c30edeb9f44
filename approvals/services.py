"""Decisions on parked runs (DESIGN.md invariants 4 and 5).

One function per decision (`approve`, `reject`, `expire_due_approvals`, `reconcile`). Each is one
transaction: a compare-and-set on the approval (`status=pending`), the step and run changes, the
audit event `approval.decided` on the run's timeline (who, when, requested and approved
arguments, the diff), and the worker's doorbell, rung on commit. A second decision on the same
item changes nothing and raises `AlreadyDecided` naming who decided and when.

The UI (views.py), the JSON API (api.py) and the sweeper all call these, so the rules are the
same everywhere.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import ToolArgumentsError, UnknownTool, get_tool
from agentruns.runtime.events import append_events, nudge_on_commit
from agentruns.runtime.redaction import redact_fields
from agentruns.services import actor_name, enqueue
from approvals.models import Approval, ApprovalKind, ApprovalStatus


class DecisionError(Exception):
    """The decision is not acceptable as given (bad arguments, over the approver's limit)."""


class AlreadyDecided(Exception):
    """Somebody (or the sweeper, or a cancel) decided first; nothing was changed."""

    def __init__(self, approval: Approval) -> None:
        self.approval = approval
        self.who = approval.decided_by.get_username() if approval.decided_by else "the system"
        self.when = approval.decided_at
        when = self.when.isoformat(timespec="seconds") if self.when else "earlier"
        if approval.resolution == "withdrawn":
            what = f"withdrawn ({approval.reason})" if approval.reason else "withdrawn"
        elif approval.resolution:
            what = f"resolved as \"{approval.resolution}\""
        else:
            what = str(approval.status)
        super().__init__(f"already {what} by {self.who} at {when}")


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


def _decision_record(approval: Approval) -> dict:
    return {
        "kind": approval.kind,
        "status": approval.status,
        "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        "reason": approval.reason,
        "requested_args": approval.requested_args,
        "edited_args": approval.edited_args,
        "resolution": approval.resolution,
        "resolution_result": approval.resolution_result,
    }


def open_reconciliation(step: Step, agent: str) -> Approval:
    earlier = Approval.objects.select_related("decided_by").filter(step=step).first()
    history = [*earlier.history, _decision_record(earlier)] if earlier is not None else []
    approval, _ = Approval.objects.update_or_create(
        step=step,
        defaults={
            "history": history,
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
    """Compare-and-set pending -> decided; the loser gets AlreadyDecided.

    The conditional UPDATE is the arbiter: on PostgreSQL a concurrent decider blocks on the row
    lock, re-reads `status` after the winner commits, matches nothing and loses.
    """
    now = timezone.now()
    won = Approval.objects.filter(id=approval_id, kind=kind, status=ApprovalStatus.PENDING).update(
        decided_by=user if getattr(user, "is_authenticated", False) else None, decided_at=now, **changes
    )
    approval = Approval.objects.select_related("step", "run", "decided_by").get(id=approval_id)
    if not won:
        _refuse_if_decided(approval, kind)
    return approval


def _refuse_if_decided(approval: Approval, kind: str) -> None:
    if approval.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(approval)
    if approval.kind != kind:
        raise DecisionError(f"this item is {_a(approval.kind)}, not {_a(kind)}")


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _ring_on_commit(run_id: Any) -> None:
    # on commit: a worker must never pick the task up before the decision is visible, and a
    # rolled-back decision must not ring at all (the sweeper re-rings a queued run if this is lost)
    transaction.on_commit(lambda: enqueue(run_id))


def _requeue(run: Run, events: list[tuple[str, dict]]) -> bool:
    """Resume a parked run; a cancelled or finished one only gets the audit events."""
    requeued = Run.objects.filter(id=run.id, status=RunStatus.WAITING).update(
        status=RunStatus.QUEUED, enqueued_at=timezone.now()
    )
    if requeued:
        events.append(("run.status", {"status": RunStatus.QUEUED}))
    append_events(run.id, events)
    if requeued:
        _ring_on_commit(run.id)
    nudge_on_commit(run.id, 0, inbox=True)
    return bool(requeued)


def hidden_fields(approval: Approval) -> list[str]:
    return list(approval.run.tool_snapshot.get(approval.tool, {}).get("redact", []))


def validate_edited_args(approval: Approval, edited: dict) -> dict:
    """The requested arguments with `edited` laid over them, checked against the tool's schema."""
    if not isinstance(edited, dict):
        raise DecisionError("edited arguments must be a JSON object")
    try:
        tool = get_tool(approval.tool)
    except UnknownTool:
        raise DecisionError(f"the tool {approval.tool} is no longer registered; cannot edit") from None
    merged = {**approval.requested_args, **edited}
    try:
        return tool.validate(merged)
    except ToolArgumentsError as exc:
        raise DecisionError(f"the edited arguments are not valid: {exc}") from None


def approver_limit_cents(user: Any) -> int | None:
    """The most this user may approve (None: no limit). Superusers (leads) have none."""
    limit = int(settings.AGENTRUNS_APPROVER_LIMIT_CENTS)
    if limit <= 0 or getattr(user, "is_superuser", False):
        return None
    return limit


def check_limit(user: Any, args: dict) -> None:
    limit = approver_limit_cents(user)
    amount = args.get("amount_cents")
    if limit is not None and isinstance(amount, int) and amount > limit:
        raise DecisionError(
            f"{amount / 100:,.2f} is above your approval limit of {limit / 100:,.2f}: "
            "lower the amount or ask a lead to approve"
        )


def args_diff(before: dict, after: dict) -> dict:
    return {
        k: {"from": before.get(k), "to": after.get(k)}
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }


def _decided_event(approval: Approval, user: Any, decision: str, **extra: Any) -> tuple[str, dict]:
    return (
        "approval.decided",
        {
            "approval": approval.id,
            "kind": approval.kind,
            "step": approval.step.index,
            "tool": approval.tool,
            "decision": decision,
            "by": actor_name(user),
            "at": approval.decided_at.isoformat() if approval.decided_at else None,
            "reason": approval.reason,
            **extra,
        },
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
        _refuse_if_decided(current, ApprovalKind.APPROVAL)
        args = current.requested_args
        if edited_args:
            args = validate_edited_args(current, edited_args)
        check_limit(user, args)
        edited = args if args != current.requested_args else None
        approval = _claim(
            approval_id, ApprovalKind.APPROVAL, user,
            status=ApprovalStatus.APPROVED, edited_args=edited, reason=reason.strip(),
        )
        step = approval.step
        step.arguments, step.approved, step.status = args, True, StepStatus.PENDING
        step.save(update_fields=["arguments", "approved", "status"])
        hidden = hidden_fields(approval)
        requested = redact_fields(approval.requested_args, hidden)
        approved = redact_fields(args, hidden)
        _requeue(
            approval.run,
            [
                _decided_event(
                    approval, user, "approved",
                    requested=requested, approved=approved,
                    diff=args_diff(requested, approved) if edited is not None else {},
                    edited=edited is not None,
                )
            ],
        )
    return approval


def reject(
    approval_id: int, *, user: Any, reason: str = "", status: str = ApprovalStatus.REJECTED
) -> Approval:
    """Reject; the agent receives `{"error": "rejected", "reason": ...}` as the tool's result."""
    reason = reason.strip() or ("expired" if status == ApprovalStatus.EXPIRED else "rejected by staff")
    with transaction.atomic():
        approval = _claim(approval_id, ApprovalKind.APPROVAL, user, status=status, reason=reason)
        step = approval.step
        step.status, step.finished_at = StepStatus.REJECTED, timezone.now()
        step.error = reason
        # the model receives this as the tool's result, so it can tell the customer why
        step.result = {"error": "rejected", "reason": reason}
        step.save(update_fields=["status", "finished_at", "error", "result"])
        requested = redact_fields(approval.requested_args, hidden_fields(approval))
        _requeue(approval.run, [_decided_event(approval, user, str(status), requested=requested)])
    return approval


def expire_due_approvals(now: Any = None) -> int:
    """Called by the sweeper: pending approvals past their expiry are rejected as "expired".

    Runs in every sweeper at once without harm: each item is claimed by the compare-and-set.
    """
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
            pass  # a person (or another sweeper) decided first
    return expired


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
        approval = _claim(
            approval_id, ApprovalKind.RECONCILIATION, user,
            status=ApprovalStatus.RESOLVED, resolution=resolution,
            resolution_result=result if resolution == "happened" else None, reason=reason.strip(),
        )
        step, run, now = approval.step, approval.run, timezone.now()
        events: list[tuple[str, dict]] = [
            _decided_event(
                approval, user, f"reconciled: {resolution}",
                resolution=resolution,
                requested=redact_fields(approval.requested_args, hidden_fields(approval)),
                result=result if resolution == "happened" else None,
            ),
        ]
        if resolution == "happened":
            step.status, step.finished_at = StepStatus.SUCCEEDED, now
            step.result = result if result is not None else {"reconciled": True, "happened": True, "by": who}
            step.error = f"outcome unknown; {who} confirmed it happened"
        elif resolution == "retry":
            step.status, step.finished_at = StepStatus.PENDING, None
            step.error = f"outcome unknown; {who} confirmed it did not happen, retrying"
        else:
            step.status, step.finished_at = StepStatus.FAILED, now
            step.error = f"aborted by {who}: outcome unknown"
        step.save(update_fields=["status", "result", "finished_at", "error"])
        if resolution != "abort":
            _requeue(run, events)
            return approval
        # abort: the run ends here; steps planned after this one never run
        Step.objects.filter(
            run=run, index__gt=step.index,
            status__in=[StepStatus.PENDING, StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN],
        ).update(status=StepStatus.SKIPPED, finished_at=now)
        withdrawn = withdraw_approvals(run, reason=f"run aborted by {who}")
        error = f"aborted by {who} after an unknown outcome of {step.tool}"
        ended = Run.objects.filter(id=run.id, status=RunStatus.WAITING).update(
            status=RunStatus.FAILED, finished_at=now, stop_reason="aborted", error=error,
            lease_owner="", lease_expires_at=None,
        )
        events += [("approval.withdrawn", {"approval": a}) for a in withdrawn]
        if ended:
            events.append(("run.status", {"status": RunStatus.FAILED, "stop_reason": "aborted", "error": error}))
        append_events(run.id, events)
        nudge_on_commit(run.id, 0, inbox=True)
    return approval
