"""Decisions on parked runs (DESIGN.md invariants 4 and 5): ONE `decide` for every door.

The inbox's pages (web/), its bulk action, the JSON API (api/), the chat endpoint (through the
runtime's inbox port, inbox.py) all call `decide(approval_id, decision, user, ...)`, so every
rule is checked once, here and in what it calls, in this order: the decision is one this item
can take, a reason or an internal note to reject (the one rule that differs per door:
`check_note`), the right to decide (`approvals.decide_approval` + `approvals.view_approval`), the decision rate limit, then
under the item's row lock: still pending, the version of the proposal decided on, whether the
deployed code can run the call, the two-person rule, the edit policy and the approver's limit.

Each decision is one transaction: the item is locked and loaded once and passed down as an
object; the domain (domain/outcomes.py) makes the compare-and-set on it (`status=pending`) and
the step change, and gathers the `Outcome`: the audit event `approval.decided` on the run's
timeline (who, when, requested and approved arguments, the diff) and what becomes of the run,
handed to the runtime in one call (resumed and its doorbell rung on commit, left waiting, or
ended). A second decision on the same item changes nothing and raises `AlreadyDecided` naming
who decided and when. `decide_many` (bulk) decides each item on its own through `decide`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from django.db import transaction

from agentruns.runtime.access.quotas import QuotaExceeded, check_decision
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.domain import policy, questions
from approvals.domain.outcomes import approved, check_open, closed, reconciled, rejected
from approvals.errors import AlreadyDecided, DecisionError, NoteRequired, StaleProposal
from approvals.models import Approval, ApprovalKind, ApprovalStatus

RESOLUTIONS = ("happened", "retry", "abort")
DECISIONS = ("approve", "reject", *RESOLUTIONS, "close", "answer")
BULK_DECISIONS = ("approve", "reject")
MAX_ITEMS = 200
# the kind of item each decision is for (the rest: approvals)
KIND_OF = {
    **dict.fromkeys(RESOLUTIONS, ApprovalKind.RECONCILIATION),
    "close": ApprovalKind.HANDOVER,
    "answer": ApprovalKind.QUESTION,
}


class Door(StrEnum):
    """Where a decision comes from, for the rules that differ per door (only the reason does)."""

    INBOX = "inbox"  # the inbox's pages, one item or in bulk
    API = "api"  # the JSON API, one item or in bulk, and scripts calling these functions
    CHAT = "chat"  # the AI SDK chat endpoint


# Rejecting (and closing a hand-over) takes the reason the agent is told and may pass on to the
# customer, and/or an internal note for staff only (the audit trail): at least one of the two,
# in every door but the chat, whose answer has no field people fill in (a rejection from there
# without a reason tells the agent only that it was rejected).
NOTE_REQUIRED = {"reject", "close"}
NOTE_OPTIONAL = {Door.CHAT}


def check_note(decision: str, reason: str, internal_note: str, door: Door) -> None:
    """NoteRequired (a 400 naming both fields) for a rejection or a close without either."""
    if decision in NOTE_REQUIRED and door not in NOTE_OPTIONAL:
        if not reason.strip() and not internal_note.strip():
            raise NoteRequired(decision)


def decide(
    approval_id: int,
    decision: str,
    user: Any,
    *,
    edited_args: dict | None = None,
    reason: str = "",
    version: int | None = None,
    result: Any = None,
    door: Door = Door.API,
    internal_note: str = "",
    answer: str = "",
) -> Approval:
    """Approve (optionally with edited arguments), reject, reconcile an unknown outcome
    (`happened`, `retry`, `abort`, with the `result` when it happened), close a hand-over, or
    answer a question (`answer`: free text, or one of the question's choices).
    `reason` is what the agent is told (a rejection's, which it may pass on to the customer);
    `internal_note` is kept for staff only (see `check_note`).

    An item needing several approvers stays pending until that many distinct people approved
    the same arguments (outcomes.py; who may: policy.py), and the run stays parked meanwhile.
    `version`: the version of the proposal the person saw (outcomes.check_open); a call
    the deployed code cannot run is never approved (`NotRunnable`), rejecting still works.
    """
    if decision not in DECISIONS:
        raise DecisionError("Unknown action.", code="unknown_decision")
    reason, note = reason.strip(), internal_note.strip()
    check_note(decision, reason, note, door)
    if decision == "answer":
        answer = questions.check_answer(answer)
    policy.check_may_decide(user)
    check_decision(user)
    with transaction.atomic():
        approval = _locked(approval_id)
        kind = KIND_OF.get(decision, ApprovalKind.APPROVAL)
        # a late click must learn who decided, not that its edits are invalid
        check_open(approval, kind, version)
        if kind == ApprovalKind.RECONCILIATION:
            outcome = reconciled(approval, user, decision, result, reason, note)
        elif kind == ApprovalKind.HANDOVER:
            outcome = closed(approval, user, reason, note)
        elif kind == ApprovalKind.QUESTION:
            outcome = questions.answered(approval, user, answer)
        elif decision == "reject":
            outcome = rejected(approval, user, reason, internal_note=note)
        else:
            outcome = approved(approval, user, edited_args, reason, note)
        outcome.carry_out()
        return approval


def approve(
    approval_id: int,
    *,
    user: Any,
    edited_args: dict | None = None,
    reason: str = "",
    version: int | None = None,
    internal_note: str = "",
) -> Approval:
    """`decide(..., "approve")` for scripts and tests."""
    return decide(
        approval_id,
        "approve",
        user,
        edited_args=edited_args,
        reason=reason,
        version=version,
        internal_note=internal_note,
    )


def reject(
    approval_id: int,
    *,
    user: Any,
    reason: str = "",
    version: int | None = None,
    internal_note: str = "",
) -> Approval:
    """`decide(..., "reject")` for scripts and tests: the agent receives
    `{"error": "rejected", "reason": ...}` as the tool's result (never the internal note)."""
    return decide(
        approval_id,
        "reject",
        user,
        reason=reason,
        version=version,
        internal_note=internal_note,
    )


def close(approval_id: int, *, user: Any, internal_note: str = "", reason: str = "") -> Approval:
    """`decide(..., "close")` for scripts and tests: a hand-over is done with."""
    return decide(approval_id, "close", user, reason=reason, internal_note=internal_note)


def answer(approval_id: int, *, user: Any, answer: str) -> Approval:
    """`decide(..., "answer")` for scripts and tests: the model gets `answer` as the result."""
    return decide(approval_id, "answer", user, answer=answer)


def reconcile(
    approval_id: int, *, user: Any, resolution: str, result: Any = None, reason: str = ""
) -> Approval:
    """`decide(..., resolution)` for scripts and tests."""
    if resolution not in RESOLUTIONS:
        raise DecisionError(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    return decide(approval_id, resolution, user, result=result, reason=reason)


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


# ------------------------------------------------------------------ many at once
def decide_one(
    approval_id: int,
    *,
    decision: str,
    user: Any,
    reason: str,
    version: int | None = None,
    door: Door = Door.API,
    internal_note: str = "",
) -> dict:
    """One item of a bulk decision: what happened, or the error and a code for scripts."""
    result: dict[str, Any] = {"id": approval_id}
    try:
        approval = decide(
            approval_id,
            decision,
            user,
            reason=reason,
            version=version,
            door=door,
            internal_note=internal_note,
        )
    except Approval.DoesNotExist:
        return {**result, "ok": False, "code": "not_found", "error": "no such approval"}
    except AlreadyDecided as exc:
        return {
            **result,
            "ok": False,
            "code": "already_decided",
            "error": str(exc),
            "status": exc.approval.status,
            "decided_by": exc.who,
            "decided_at": iso(exc.when),
        }
    except StaleProposal as exc:  # selected before it changed: the current version
        return {**result, "ok": False, "code": exc.code, "error": str(exc), "version": exc.current}
    except DecisionError as exc:
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
    door: Door = Door.API,
    internal_note: str = "",
) -> list[dict]:
    """Bulk decisions: many items with one reason, each its own decision through `decide` (its
    own transaction and compare-and-set, limit check and audit event), so one item that cannot
    be decided never blocks or undoes the others. No edits in bulk: the requested arguments are
    approved as they are.

    One result per distinct id, in the order given. `held` (id -> the person on it): items
    left as they are, with the code `claimed` (the inbox, unless the person confirmed).
    `versions` (id -> the version of the proposal selected): a changed item is not decided.
    Nobody acts on items they may not see: without both rights nothing is decided."""
    policy.check_may_decide(user)
    if decision not in BULK_DECISIONS:
        raise DecisionError(f"decision must be one of {', '.join(BULK_DECISIONS)}")
    check_note(decision, reason, internal_note, door)  # one reason or note for all of them
    unique = list(dict.fromkeys(ids))
    if len(unique) > MAX_ITEMS:
        raise DecisionError(f"at most {MAX_ITEMS} items at once", code="too_many")
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
            door=door,
            internal_note=internal_note,
        )
        for approval_id in unique
    ]


def _left_claimed(approval_id: int, holder: Any) -> dict:
    error = f"{actor_name(holder)} is on this item; left as it is"
    return {"id": approval_id, "ok": False, "code": "claimed", "error": error}


def summary(results: list[dict]) -> dict[str, int]:
    counts = {"approved": 0, "rejected": 0, "recorded": 0, "failed": 0}
    for r in results:
        counts[r["result"] if r["ok"] else "failed"] += 1
    return counts
