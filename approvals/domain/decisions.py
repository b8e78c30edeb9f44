"""People's decisions as they are shown (DESIGN.md 3, 4.6): this round's approvers for the audit
events, the two-person fields of the API, and the diff of an edit. The rows themselves (one per
person's decision) and the count of the two-person rule are written where an item is decided,
domain/outcomes.py, whose docstring says how rounds and versions work.
"""

from __future__ import annotations

from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.models import Approval, DecisionKind


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
                "internal_note": d.internal_note,
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
