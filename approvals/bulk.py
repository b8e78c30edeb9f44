"""Bulk decisions: approve or reject many items with one reason, each its own decision.

Every item goes through the same service as a single decision (`services.approve` /
`services.reject`: its own transaction and compare-and-set, its own limit check, its own audit
event), so one item that cannot be decided never blocks or undoes the others. No edits in bulk:
the requested arguments are approved as they are. The answer is one result per id, in the
order given: what happened, or the error and a code for scripts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentruns.runtime.quotas import QuotaExceeded
from agentruns.runtime.timestamps import iso
from approvals import policy, services
from approvals.models import Approval, ApprovalStatus

MAX_ITEMS = 200
DECISIONS = ("approve", "reject")


def decide_one(
    approval_id: int, *, decision: str, user: Any, reason: str, version: int | None = None
) -> dict:
    result: dict[str, Any] = {"id": approval_id}
    try:
        if decision == "approve":
            approval = services.approve(approval_id, user=user, reason=reason, version=version)
        else:
            approval = services.reject(approval_id, user=user, reason=reason, version=version)
    except Approval.DoesNotExist:
        return {**result, "ok": False, "code": "not_found", "error": "no such approval"}
    except services.AlreadyDecided as exc:
        return {
            **result,
            "ok": False,
            "code": "already_decided",
            "error": str(exc),
            "status": exc.approval.status,
            "decided_by": exc.who,
            "decided_at": iso(exc.when),
        }
    except services.StaleProposal as exc:  # selected before it changed: the current version
        return {**result, "ok": False, "code": exc.code, "error": str(exc), "version": exc.current}
    except services.DecisionError as exc:
        return {**result, "ok": False, "code": exc.code, "error": str(exc)}
    except QuotaExceeded as exc:  # left as it is: the answer says when to try the rest again
        return {**result, "ok": False, "code": "rate_limited", "error": str(exc)}
    result.update(ok=True, status=approval.status)
    if approval.status == ApprovalStatus.PENDING:
        # a two-person item: this approval is recorded, the item waits for another approver
        result.update(result="recorded", code="needs_second_approver")
    else:
        result["result"] = "approved" if decision == "approve" else "rejected"
    return result


def decide_many(
    ids: list[int],
    *,
    decision: str,
    user: Any,
    reason: str = "",
    held: Mapping[int, Any] | None = None,
    versions: Mapping[int, int | None] | None = None,
) -> list[dict]:
    """One result per distinct id, in the order given. `held` (id -> the person on it): items
    left as they are, with the code `claimed` (the inbox, unless the person confirmed).
    `versions` (id -> the version of the proposal selected): a changed item is not decided.
    Nobody acts on items they may not see: without both rights nothing is decided."""
    policy.check_may_decide(user)
    if decision not in DECISIONS:
        raise services.DecisionError(f"decision must be one of {', '.join(DECISIONS)}")
    unique = list(dict.fromkeys(ids))
    if len(unique) > MAX_ITEMS:
        raise services.DecisionError(f"at most {MAX_ITEMS} items at once", code="too_many")
    held, versions = held or {}, versions or {}
    return [
        _left_claimed(approval_id, held[approval_id])
        if approval_id in held
        else decide_one(
            approval_id,
            decision=decision,
            user=user,
            reason=reason,
            version=versions.get(approval_id),
        )
        for approval_id in unique
    ]


def _left_claimed(approval_id: int, holder: Any) -> dict:
    error = f"{holder.get_username()} is on this item; left as it is"
    return {"id": approval_id, "ok": False, "code": "claimed", "error": error}


def summary(results: list[dict]) -> dict[str, int]:
    counts = {"approved": 0, "rejected": 0, "recorded": 0, "failed": 0}
    for r in results:
        counts[r["result"] if r["ok"] else "failed"] += 1
    return counts
