"""One row per person's decision, and the count of the two-person rule (DESIGN.md 3, 4.6).

An item is approved when `approvals_required` distinct people approved the same arguments in
the current round. What an edit does: approving with arguments that differ from the current
proposal (what the agent asked for, or an earlier approver's edit) makes them the new proposal
and starts a new round: earlier approvals were for other arguments, so the count starts again
from the editor (who counts as its first approval). Everyone, including earlier approvers,
may approve the new proposal. So whatever finally executes was approved, exactly as executed,
by the required number of different people. The number required is fixed when the item opens
(from the agent's arguments) and an edit can raise it, never lower it.

Versions: every item carries `version` (1 when it opens, one more on every approval given, an
edit being one), so a decision names what the person saw. A decision on an older version changes
nothing (`StaleProposal`, a 409 with the current proposal, in every door). Without a version
(the JSON API only) a decision is accepted only while nobody has edited the arguments.

The caller holds the approval row's lock (`services.decide`), so two approvers
racing for the last approval are serialised: the second sees the item approved and loses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from agentruns.registry.edits import same_value
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.domain.policy import is_edit
from approvals.models import Approval, ApprovalDecision, DecisionKind


@dataclass
class Progress:
    decision: ApprovalDecision
    complete: bool  # the required count is reached: the caller settles the item as approved
    restarted: bool  # this approval changed the arguments and started a new round


def _row(approval: Approval, user: Any, decision: str, **fields: Any) -> ApprovalDecision:
    return ApprovalDecision.objects.create(
        approval=approval,
        user=user if getattr(user, "is_authenticated", False) else None,
        username=actor_name(user) or "",
        decision=decision,
        round=approval.round,
        decided_at=timezone.now(),
        **fields,
    )


def record_approval(
    approval: Approval, user: Any, args: dict, reason: str, required: int
) -> Progress:
    """Count `user`'s approval of `args` (checked by approvals.domain.policy), which need `required`
    approvers (the tool's `approvals_required`); saves the counters."""
    restarted = is_edit(approval, args)
    if restarted:
        if approval.approvals_given:
            approval.round += 1
        approval.approvals_given = 0
        approval.edited_args = None if same_value(args, approval.requested_args) else args
    # an edit can raise the number required, never lower it
    approval.approvals_required = max(approval.approvals_required, required)
    row = _row(approval, user, DecisionKind.APPROVE, args=args, edited=restarted, reason=reason)
    approval.approvals_given += 1
    approval.version += 1
    approval.save(
        update_fields=["round", "approvals_given", "approvals_required", "edited_args", "version"]
    )
    return Progress(row, approval.approvals_given >= approval.approvals_required, restarted)


def record_rejection(approval: Approval, user: Any, reason: str) -> ApprovalDecision:
    return _row(approval, user, DecisionKind.REJECT, reason=reason)


def approvers(approval: Approval) -> list[dict]:
    """This round's approvals for the audit events and the API: who and when."""
    return [
        {"by": d.username, "at": iso(d.decided_at), "edited": d.edited}
        for d in approval.current_approvals()
    ]


def payload(approval: Approval) -> dict:
    """The two-person fields of an approval, for the API (decisions prefetched or not)."""
    return {
        "approvals_required": approval.approvals_required,
        "approvals_given": approval.approvals_given,
        "round": approval.round,
        "version": approval.version,
        "starter": actor_name(approval.run.created_by),
        "decisions": [
            {
                "by": d.username,
                "decision": d.decision,
                "at": iso(d.decided_at),
                "round": d.round,
                "counted": d.decision == DecisionKind.APPROVE and d.round == approval.round,
                "edited": d.edited,
                "args": approval.redacted(d.args),
                "reason": d.reason,
            }
            for d in approval.decisions.all()
        ],
    }


# ------------------------------------------------------------------ the audit event's diff
def args_diff(before: dict, after: dict) -> dict:
    return {
        k: {"from": before.get(k), "to": after.get(k)}
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }
