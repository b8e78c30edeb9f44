"""The runtime's side of the inbox: park a step for a human, withdraw it, expire it.

Called through the runtime's inbox port (inbox.py): by the executor (open an approval or a
reconciliation), by cancelling (withdraw) and by the sweeper (expire). Staff decisions live in
`services.py`; both use the compare-and-set `settle` here, so "first decision wins" is one rule
whoever decides.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, Step
from agentruns.registry.deployed import approvals_required
from agentruns.runtime.execution.transitions import resume_parked
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.values.timestamps import iso
from approvals.domain.decisions import decided_event
from approvals.domain.escalation import due_at_for
from approvals.errors import AlreadyDecided, DecisionError
from approvals.models import Approval, ApprovalKind, ApprovalStatus, MailNotice
from approvals.notifications import outbox


def args_digest(args: Any) -> str:
    """The digest of a call's arguments (canonical JSON): what was approved is what runs."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def approved_call_refusal(step: Step) -> str:
    """Checked by the executor right before an approved call runs: the arguments about to run
    must have the digest of the arguments the final approval approved ("" when they do)."""
    approval = Approval.objects.filter(step=step).only("id", "round").first()
    final = (
        approval.decisions.filter(decision="approve", round=approval.round)
        .order_by("-decided_at", "-id")
        .values_list("args", flat=True)
        .first()
        if approval is not None
        else None
    )
    if final is None:
        return "refused: no approval of these arguments is on record; the call was not made"
    if args_digest(final) != args_digest(step.arguments):
        return (
            "refused: the arguments differ from the ones approved (digest "
            f"{args_digest(final)[:12]}); the call was not made"
        )
    return ""


# ------------------------------------------------------------------ opened by the engine
def open_approval(step: Step, agent: str) -> Approval:
    expiry, now = conf.APPROVAL_EXPIRY_SECONDS, timezone.now()
    run = Run.objects.get(id=step.run_id)
    approval = Approval.objects.create(
        approvals_required=approvals_required(step.tool, step.arguments),
        step=step,
        run=run,
        kind=ApprovalKind.APPROVAL,
        agent=agent,
        tool=step.tool,
        requested_args=step.arguments,
        expires_at=now + timedelta(seconds=expiry) if expiry > 0 else None,
        due_at=due_at_for(run, step.tool, now),
    )
    _announce_opened(approval)
    return approval


def _announce_opened(approval: Approval) -> None:
    """The item is in the inbox: viewers, webhooks and (batched) email hear of it on commit."""
    outbox.record(outbox.APPROVAL_REQUESTED, approval=approval)
    outbox.queue_mail(approval, MailNotice.Kind.REQUESTED)
    nudge_on_commit(approval.run_id, 0, inbox=True)


def _decision_record(approval: Approval) -> dict:
    return {
        "kind": approval.kind,
        "status": approval.status,
        "decided_by": approval.decided_by_name,
        "decided_at": iso(approval.decided_at),
        "reason": approval.reason,
        "requested_args": approval.requested_args,
        "edited_args": approval.edited_args,
        "resolution": approval.resolution,
        "resolution_result": approval.resolution_result,
        "approvals": [
            {"by": d.username, "at": iso(d.decided_at)}
            for d in approval.decisions.filter(decision="approve", round=approval.round)
        ],
    }


def open_reconciliation(step: Step, agent: str) -> Approval:
    """The step's outcome is unknown; the step's one Approval row is reused, and an earlier
    decision on it (who approved the call before it was interrupted) moves to its history."""
    earlier = Approval.objects.select_related("decided_by").filter(step=step).first()
    history = [*earlier.history, _decision_record(earlier)] if earlier is not None else []
    run = Run.objects.get(id=step.run_id)
    approval, _ = Approval.objects.update_or_create(
        step=step,
        defaults={
            "history": history,
            "run": run,
            "kind": ApprovalKind.RECONCILIATION,
            "status": ApprovalStatus.PENDING,
            "agent": agent,
            "tool": step.tool,
            "requested_args": step.arguments,
            "decided_by": None,
            "decided_at": None,
            "resolution": "",
            "expires_at": None,
            # a new item: its own due time, nobody on it yet
            "due_at": due_at_for(run, step.tool),
            "escalated_at": None,
            "claimed_by": None,
            "claimed_at": None,
            # one person reconciles, whatever the call needed to be approved
            "approvals_required": 1,
            "approvals_given": 0,
        },
    )
    _announce_opened(approval)
    return approval


def withdraw_approvals(run: Run, *, reason: str) -> list[int]:
    ids = list(
        Approval.objects.filter(run=run, status=ApprovalStatus.PENDING).values_list("id", flat=True)
    )
    if ids:
        Approval.objects.filter(id__in=ids, status=ApprovalStatus.PENDING).update(
            status=ApprovalStatus.RESOLVED,
            resolution="withdrawn",
            reason=reason,
            decided_at=timezone.now(),
        )
        for approval in Approval.objects.select_related("decided_by").filter(id__in=ids):
            approval.run = run
            outbox.record(outbox.APPROVAL_WITHDRAWN, approval=approval, run=run)
        nudge_on_commit(run.id, 0, inbox=True)
    return ids


# ------------------------------------------------------------------ first decision wins
def settle(approval_id: int, kind: str, user: Any, **changes: Any) -> Approval:
    """Compare-and-set pending -> decided; the loser gets AlreadyDecided.

    The conditional UPDATE is the arbiter: on PostgreSQL a concurrent decider blocks on the row
    lock, re-reads `status` after the winner commits, matches nothing and loses.
    """
    won = Approval.objects.filter(id=approval_id, kind=kind, status=ApprovalStatus.PENDING).update(
        decided_by=user if getattr(user, "is_authenticated", False) else None,
        decided_at=timezone.now(),
        **changes,
    )
    approval = Approval.objects.select_related("step", "run", "decided_by").get(id=approval_id)
    if not won:
        refuse_if_decided(approval, kind)
    outbox.record(outbox.APPROVAL_DECIDED, approval=approval)
    return approval


def refuse_if_decided(approval: Approval, kind: str) -> None:
    if approval.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(approval)
    if approval.kind != kind:
        raise DecisionError(f"this item is {_a(approval.kind)}, not {_a(kind)}", code="wrong_kind")


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def reject_parked(
    approval_id: int, *, user: Any, reason: str, status: str = ApprovalStatus.REJECTED
) -> Approval:
    """Settle as rejected (or expired); the agent receives `{"error": "rejected", "reason": ...}`
    as the tool's result, so it can tell the customer why. Inside the caller's transaction."""
    approval = settle(approval_id, ApprovalKind.APPROVAL, user, status=status, reason=reason)
    approval.step.reject(reason)
    resume_parked(
        approval.run_id,
        [decided_event(approval, user, str(status), requested=approval.visible_args())],
    )
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
            with transaction.atomic():
                reject_parked(
                    approval_id, user=None, reason="expired", status=ApprovalStatus.EXPIRED
                )
            expired += 1
        except AlreadyDecided:
            pass  # a person (or another sweeper) decided first
    return expired
