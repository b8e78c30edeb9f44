"""The runtime's side of the inbox: park a step for a human, withdraw it.

Called through the runtime's inbox port (inbox.py): by the executor (open an approval or a
reconciliation, and check an approved call's arguments right before it runs) and by cancelling
(withdraw). Decisions, the sweeper's expiry among them, are outcomes.py's.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

from agentruns.models import Run, Step
from agentruns.registry import OperationKeyError, Tool, get_tool, has_tool
from agentruns.registry.deployed import approvals_required
from agentruns.runtime.operations.gate import key_for
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.values.timestamps import iso
from approvals.conf import conf
from approvals.domain.escalation import due_at_for
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


def approval_of(step: Step) -> dict[str, Any] | None:
    """The approval that let `step` run, as its tool reads it (`ToolContext.approval`): who
    approved last and when, their reason (the words for the customer: never the internal note),
    what the agent asked for and what was approved (redacted fields as they stand: the tool
    already has its own arguments)."""
    approval = (
        Approval.objects.filter(
            step=step, kind=ApprovalKind.APPROVAL, status=ApprovalStatus.APPROVED
        )
        .select_related("decided_by")
        .first()
    )
    if approval is None:
        return None
    return {
        "by": approval.decided_by_name,
        "at": iso(approval.decided_at),
        "reason": approval.reason,
        "requested": approval.requested_args,
        "approved": approval.effective_args,
    }


def operation_key_of(run: Run, tool: Tool | None, args: dict) -> str:
    """The call's operation key for the inbox ("" when it takes none or cannot have one)."""
    try:
        return (key_for(run, tool, args) or "") if tool is not None else ""
    except OperationKeyError:
        return ""  # the executor refuses such a call; the card shows no key


# ------------------------------------------------------------------ opened by the engine
def open_approval(step: Step, agent: str) -> Approval:
    expiry, now = conf.APPROVAL_EXPIRY_SECONDS, timezone.now()
    run = Run.objects.get(id=step.run_id)
    tool = get_tool(step.tool) if has_tool(step.tool) else None
    approval = Approval.objects.create(
        operation_key=operation_key_of(run, tool, step.arguments),
        approvals_required=approvals_required(step.tool, step.arguments),
        step=step,
        run=run,
        kind=ApprovalKind.APPROVAL,
        agent=agent,
        tool=step.tool,
        requested_args=step.arguments,
        expires_at=now + timedelta(seconds=expiry) if expiry > 0 else None,
        due_at=due_at_for(run, step.tool, now),
        priority=run.priority,
    )
    _announce_opened(approval)
    return approval


def _announce_opened(approval: Approval, event: str = outbox.APPROVAL_REQUESTED) -> None:
    """The item is in the inbox: viewers, webhooks and (batched) email hear of it on commit."""
    outbox.record(event, approval=approval)
    outbox.queue_mail(approval, MailNotice.Kind.REQUESTED)
    nudge_on_commit(approval.run_id, 0, inbox=True)


def _decision_record(approval: Approval) -> dict:
    return {
        "kind": approval.kind,
        "status": approval.status,
        "decided_by": approval.decided_by_name,
        "decided_at": iso(approval.decided_at),
        "reason": approval.reason,
        "internal_note": approval.internal_note,
        "requested_args": approval.requested_args,
        "edited_args": approval.edited_args,
        "resolution": approval.resolution,
        "resolution_result": approval.resolution_result,
        "approvals": [
            {"by": d.username, "at": iso(d.decided_at)}
            for d in approval.decisions.filter(decision="approve", round=approval.round)
        ],
    }


def _reopened(step: Step, agent: str, kind: str, **fresh: Any) -> Approval:
    """The step's one Approval row as a new pending item of `kind`; an earlier decision on it
    (who approved the call before it was interrupted) moves to its history."""
    earlier = Approval.objects.select_related("decided_by").filter(step=step).first()
    history = [*earlier.history, _decision_record(earlier)] if earlier is not None else []
    run = Run.objects.get(id=step.run_id)
    approval, _ = Approval.objects.update_or_create(
        step=step,
        defaults={
            "history": history,
            "run": run,
            "kind": kind,
            "status": ApprovalStatus.PENDING,
            "agent": agent,
            "tool": step.tool,
            "requested_args": step.arguments,
            "decided_by": None,
            "decided_at": None,
            "resolution": "",
            "internal_note": "",  # an earlier decision's note lives on in `history`
            "expires_at": None,
            # a new item: its own due time, nobody on it yet
            "due_at": due_at_for(run, step.tool),
            "escalated_at": None,
            "claimed_by": None,
            "claimed_at": None,
            # one person settles it, whatever the call needed to be approved
            "approvals_required": 1,
            "approvals_given": 0,
            "priority": run.priority,
            **fresh,
        },
    )
    return approval


def open_reconciliation(step: Step, agent: str) -> Approval:
    """The step's outcome is unknown: a person says what happened."""
    approval = _reopened(step, agent, ApprovalKind.RECONCILIATION)
    _announce_opened(approval)
    return approval


def open_handover(step: Step, agent: str) -> Approval | None:
    """The run handed its request over to a person with this step (a successful call of a
    `handover=True` tool; runtime/outcomes.py, when the run ends): an item someone picks up
    (claims) and closes with a note. It never expires and no cancel withdraws it: it is work for
    a person, whatever becomes of the run. None when the step has one already (a retried run
    that ends again)."""
    if Approval.objects.filter(step=step, kind=ApprovalKind.HANDOVER).exists():
        return None
    approval = _reopened(step, agent, ApprovalKind.HANDOVER, edited_args=None, reason="")
    _announce_opened(approval, outbox.HANDOVER_OPENED)
    return approval


def open_question(
    step: Step, agent: str, *, token: str, question: str, choices: list[str] | None
) -> Approval:
    """The run asks a person a question with this call (`ask_human`): answered with text (or
    one of `choices`), which resolves the wait on `token`. It never expires; it escalates like
    any item, and a cancel withdraws it."""
    run = Run.objects.get(id=step.run_id)
    approval = Approval.objects.create(
        step=step,
        run=run,
        kind=ApprovalKind.QUESTION,
        agent=agent,
        tool=step.tool,
        requested_args={"question": question, "choices": choices},
        wait_token=token,
        due_at=due_at_for(run, step.tool),
        priority=run.priority,
    )
    _announce_opened(approval, outbox.QUESTION_ASKED)
    return approval


def withdraw_approvals(run: Run, *, reason: str) -> list[int]:
    ids = list(
        Approval.objects.filter(run=run, status=ApprovalStatus.PENDING)
        .exclude(kind=ApprovalKind.HANDOVER)  # a person's work, whatever becomes of the run
        .values_list("id", flat=True)
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
