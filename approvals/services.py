"""Decisions on parked runs (DESIGN.md invariants 4 and 5): ONE `decide` for every door.

The inbox's pages (web/), its bulk action, the JSON API (api/), the chat endpoint (through the
runtime's inbox port, inbox.py) all call `decide(approval_id, decision, user, ...)`, so every
rule is checked once, here and in what it calls, in this order: the decision is one this item
can take, the reason (the one rule that differs per door: `REASON_REQUIRED`), the right to
decide (`approvals.decide_approval` + `approvals.view_approval`), the decision rate limit, then
under the item's row lock: still pending, the version of the proposal decided on, whether the
deployed code can run the call, the two-person rule, the edit policy and the approver's limit.

Each decision is one transaction: a compare-and-set on the approval (`status=pending`), the
step and run changes, the audit event `approval.decided` on the run's timeline (who, when,
requested and approved arguments, the diff), and the worker's doorbell, rung on commit. A second
decision on the same item changes nothing and raises `AlreadyDecided` naming who decided and
when. `decide_many` (bulk) decides each item on its own through `decide`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry.deployed import deployed_tool
from agentruns.runtime.access.quotas import QuotaExceeded, check_decision
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.execution.transitions import RunChange, aborted, apply, resume_parked
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.domain import decisions, policy
from approvals.domain.decisions import args_diff, decided_event
from approvals.domain.parking import refuse_if_decided, reject_parked, settle, withdraw_approvals
from approvals.errors import AlreadyDecided, DecisionError, NotRunnable, StaleProposal
from approvals.models import Approval, ApprovalKind, ApprovalStatus

RESOLUTIONS = ("happened", "retry", "abort")
DECISIONS = ("approve", "reject", *RESOLUTIONS)
BULK_DECISIONS = ("approve", "reject")
MAX_ITEMS = 200


class Door(StrEnum):
    """Where a decision comes from, for the rules that differ per door (only the reason does)."""

    INBOX = "inbox"  # the inbox's pages, one item or in bulk
    API = "api"  # the JSON API, one item or in bulk, and scripts calling these functions
    CHAT = "chat"  # the AI SDK chat endpoint


# A rejection's reason is passed on to the customer by the agent. A person in the inbox must
# write one; the API and the chat (whose answer has no text field people fill in) may leave it
# out, and the agent is then told REJECTED_BY_DEFAULT.
REASON_REQUIRED = {Door.INBOX}
REJECTED_BY_DEFAULT = "rejected by staff"
NO_REASON = "Give a reason for the rejection: the agent passes it on to the customer."


def reason_for(decision: str, reason: str, door: Door) -> str:
    """The reason recorded for `decision` from `door` (the per-door rule above)."""
    reason = reason.strip()
    if decision == "reject" and not reason:
        if door in REASON_REQUIRED:
            raise DecisionError(NO_REASON, code="reason_required")
        return REJECTED_BY_DEFAULT
    return reason


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
) -> Approval:
    """Approve (optionally with edited arguments), reject, or reconcile an unknown outcome
    (`happened`, `retry`, `abort`, with the `result` when it happened).

    An item needing several approvers stays pending until that many distinct people approved
    the same arguments (decisions.py; who may: policy.py), and the run stays parked meanwhile.
    `version`: the version of the proposal the person saw (decisions.check_version); a call
    the deployed code cannot run is never approved (`NotRunnable`), rejecting still works.
    """
    if decision not in DECISIONS:
        raise DecisionError("Unknown action.", code="unknown_decision")
    reason = reason_for(decision, reason, door)
    policy.check_may_decide(user)
    check_decision(user)
    with transaction.atomic():
        if decision in RESOLUTIONS:
            return _reconcile(approval_id, user, decision, result, reason)
        current = _locked(approval_id)
        # a late click must learn who decided, not that its edits are invalid
        refuse_if_decided(current, ApprovalKind.APPROVAL)
        decisions.check_version(current, version)
        if decision == "reject":
            approval = reject_parked(approval_id, user=user, reason=reason)
            decisions.record_rejection(approval, user, reason)
            return approval
        return _approve(current, user, edited_args, reason)


def approve(
    approval_id: int,
    *,
    user: Any,
    edited_args: dict | None = None,
    reason: str = "",
    version: int | None = None,
) -> Approval:
    """`decide(..., "approve")` for scripts and tests."""
    return decide(
        approval_id, "approve", user, edited_args=edited_args, reason=reason, version=version
    )


def reject(
    approval_id: int, *, user: Any, reason: str = "", version: int | None = None
) -> Approval:
    """`decide(..., "reject")` for scripts and tests: the agent receives
    `{"error": "rejected", "reason": ...}` as the tool's result."""
    return decide(approval_id, "reject", user, reason=reason, version=version)


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


def _approve(current: Approval, user: Any, edited_args: dict | None, reason: str) -> Approval:
    """The step keeps its idempotency key and runs with the approved arguments; the requested
    ones stay on the approval, the full approved set goes to `edited_args` when it differs."""
    # the deployed tool, looked up once: whether the call can run, its edit policy, its amount
    # argument and how many approvers the approved arguments need
    tool, why = deployed_tool(current.agent, current.tool, current.effective_args)
    if why or tool is None:
        raise NotRunnable(why, code="not_runnable")
    policy.check_may_approve(current, user)
    args = policy.proposed_args(current, edited_args, tool)
    policy.check_limit(current, user, args, tool)
    progress = decisions.record_approval(current, user, args, reason, tool.approvals_for(args))
    if not progress.complete:
        decisions.announce_progress(current, user, progress)
        return current
    edited = current.edited_args
    approval = settle(
        current.id,
        ApprovalKind.APPROVAL,
        user,
        status=ApprovalStatus.APPROVED,
        edited_args=edited,
        reason=reason,
    )
    step = approval.step
    step.arguments, step.approved, step.status = args, True, StepStatus.PENDING
    step.save(update_fields=["arguments", "approved", "status"])
    requested, approved = approval.visible_args(), approval.redacted(args)
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


def _reconcile(approval_id: int, user: Any, resolution: str, result: Any, reason: str) -> Approval:
    """Staff say what happened to a call whose outcome is unknown (DESIGN.md 4.4).

    happened: the step succeeds with the given result (or a marker) and the run continues;
    retry: the step runs again (same idempotency key); abort: the run fails, nothing more runs.
    """
    who = actor_name(user) or "staff"
    approval = settle(
        approval_id,
        ApprovalKind.RECONCILIATION,
        user,
        status=ApprovalStatus.RESOLVED,
        resolution=resolution,
        resolution_result=result if resolution == "happened" else None,
        reason=reason,
    )
    step, now = approval.step, timezone.now()
    run = Run.objects.select_for_update().get(id=approval.run_id)
    events: list[EventSpec] = [
        decided_event(
            approval,
            user,
            f"reconciled: {resolution}",
            resolution=resolution,
            requested=approval.visible_args(),
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


# ------------------------------------------------------------------ many at once
def decide_one(
    approval_id: int,
    *,
    decision: str,
    user: Any,
    reason: str,
    version: int | None = None,
    door: Door = Door.API,
) -> dict:
    """One item of a bulk decision: what happened, or the error and a code for scripts."""
    result: dict[str, Any] = {"id": approval_id}
    try:
        approval = decide(approval_id, decision, user, reason=reason, version=version, door=door)
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
