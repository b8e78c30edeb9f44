"""Due times and escalation: an item waiting past its due time escalates, exactly once.

`due_at_for` is read when an item opens: the tool's `escalate_after` as frozen in the run's
snapshot, else AGENTRUNS_APPROVAL_ESCALATE_SECONDS (0: never). The sweeper calls
`escalate_due_approvals` in every worker at once; each item is a compare-and-set on
`escalated_at IS NULL`, so exactly one of them wins and writes, in the same transaction, the
`approval.escalated` event on the run's timeline, the webhook deliveries and the mail notice.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from agentruns.models import Run
from agentruns.runtime import writer
from agentruns.runtime.events import EventType
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.values.timestamps import iso
from approvals.conf import conf
from approvals.models import Approval, ApprovalStatus, MailNotice
from approvals.notifications import outbox

BATCH = 200


def escalate_after_seconds(run: Run, tool: str) -> float:
    configured = run.tool_policy(tool).get("escalate_after")
    return float(conf.APPROVAL_ESCALATE_SECONDS if configured is None else configured)


def due_at_for(run: Run, tool: str, now: datetime | None = None) -> datetime | None:
    seconds = escalate_after_seconds(run, tool)
    if seconds <= 0:
        return None
    return (now or timezone.now()) + timedelta(seconds=seconds)


def escalate_due_approvals(now: datetime | None = None) -> int:
    """Escalate pending items past their due time; safe in any number of sweepers at once."""
    now = now or timezone.now()
    due = Approval.objects.filter(
        status=ApprovalStatus.PENDING, escalated_at__isnull=True, due_at__lte=now
    ).values_list("id", flat=True)[:BATCH]
    escalated = 0
    for approval_id in list(due):
        with transaction.atomic():
            won = Approval.objects.filter(
                id=approval_id, status=ApprovalStatus.PENDING, escalated_at__isnull=True
            ).update(escalated_at=now)
            if not won:
                continue  # another sweeper, or a decision, came first
            approval = Approval.objects.select_related("run", "step", "claimed_by").get(
                id=approval_id
            )
            writer.append(
                approval.run_id,
                [
                    (
                        EventType.APPROVAL_ESCALATED,
                        {
                            "approval": approval.id,
                            "step": approval.step.index,
                            "tool": approval.tool,
                            "due_at": iso(approval.due_at),
                            "at": iso(now),
                        },
                    )
                ],
            )
            outbox.record(outbox.APPROVAL_ESCALATED, approval=approval, run=approval.run)
            outbox.queue_mail(approval, MailNotice.Kind.ESCALATED)
            nudge_on_commit(approval.run_id, 0, inbox=True)
            escalated += 1
    return escalated
