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

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.ids import actor_name
from agentruns.runtime.nudges import nudge_on_commit
from agentruns.runtime.quotas import check_decision
from agentruns.runtime.redaction import redact_fields
from agentruns.runtime.transitions import RunChange, aborted, apply, resume_parked
from approvals import decisions, policy
from approvals.decisions import StaleProposal
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from approvals.parking import (
    AlreadyDecided,
    DecisionError,
    args_diff,
    cannot_run,
    decided_event,
    refuse_if_decided,
    reject_parked,
    settle,
    withdraw_approvals,
)
from approvals.policy import AlreadyGiven, EditNotAllowed, NotAllowed

__all__ = [
    "AlreadyDecided",
    "AlreadyGiven",
    "DecisionError",
    "EditNotAllowed",
    "NotAllowed",
    "NotRunnable",
    "StaleProposal",
    "approve",
    "reconcile",
    "reject",
]


class NotRunnable(DecisionError):
    """The deployed code cannot execute this call (its agent or tool is gone, or the arguments
    no longer fit the tool's schema): approving is refused, rejecting is not."""

    status = 409


def _locked(approval_id: int) -> Approval:
    """The approval row, locked until the decision commits: concurrent deciders queue here, so
    counting approvals (the two-person rule) and "first decision wins" are one serial story.

    The lock is taken first and the row read after it: a locking read that waited for another
    decider re-checks only the locked row, so a join in the same statement (who decided) would
    still show the state from before that decider committed ("by the system")."""
    Approval.objects.select_for_update().filter(id=approval_id).values_list("id").get()
    return Approval.objects.select_related("run", "run__created_by", "step", "decided_by").get(
        id=approval_id
    )


def _check_decision(current: Approval, version: int | None) -> None:
    """What every decision checks first, in this order: still pending and of this kind, then
    made on the current version of the proposal."""
    refuse_if_decided(current, ApprovalKind.APPROVAL)
    decisions.check_version(current, version)


def approve(
    approval_id: int,
    *,
    user: Any,
    edited_args: dict | None = None,
    reason: str = "",
    version: int | None = None,
) -> Approval:
    """Approve, optionally with edited arguments (the tool's edit policy and schema apply).

    An item needing several approvers stays pending until that many distinct people approved
    the same arguments (approvals/decisions.py; who may: approvals/policy.py), and the run stays
    parked meanwhile. The step keeps its idempotency key and runs with the approved arguments;
    the requested ones stay on the approval, the full approved set goes to `edited_args` when it
    differs.

    `version`: the version of the proposal the person saw (decisions.check_version); a call
    the deployed code cannot run is never approved (`NotRunnable`).
    """
    policy.check_may_decide(user)
    check_decision(user)
    with transaction.atomic():
        current = _locked(approval_id)
        # a late click must learn who decided, not that its edits are invalid
        _check_decision(current, version)
        if why := cannot_run(current.agent, current.tool, current.effective_args):
            raise NotRunnable(why, code="not_runnable")
        policy.check_may_approve(current, user)
        args = policy.proposed_args(current, edited_args)
        policy.check_limit(current, user, args)
        progress = decisions.record_approval(current, user, args, reason.strip())
        if not progress.complete:
            decisions.announce_progress(current, user, progress)
            return current
        edited = current.edited_args
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
                    approvals=decisions.approvers(approval),
                )
            ],
        )
    return approval


def reject(
    approval_id: int, *, user: Any, reason: str = "", version: int | None = None
) -> Approval:
    """Reject; the agent receives `{"error": "rejected", "reason": ...}` as the tool's result.
    One rejection by anyone who may decide ends the item, however many approvals it had.
    `version` as for `approve`."""
    reason = reason.strip() or "rejected by staff"
    policy.check_may_decide(user)
    check_decision(user)
    with transaction.atomic():
        _check_decision(_locked(approval_id), version)
        approval = reject_parked(approval_id, user=user, reason=reason)
        decisions.record_rejection(approval, user, reason)
        return approval


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
    policy.check_may_decide(user)
    check_decision(user)
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
