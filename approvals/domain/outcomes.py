"""Deciding an item, and what the decision does to its run: ONE call down to the runtime.

First decision wins: `check_open` (still pending, of the kind decided, on the current version:
see below) and the compare-and-set `settle`. Each decision (approved,
rejected, expired by the sweeper, reconciled, and a partial approval of a two-person item)
changes the item and its step here and ends in an `Outcome`: the settled item, what the audit
event says, and what becomes of the parked run (`then`: resumed, left waiting, or ended). The
event data is built once, at the end, from the settled item (its arguments redacted as people
see them), and `carry_out` hands the events and `then` to the runtime's `resume_parked`, inside
the decider's transaction.

The two-person rule (DESIGN.md 3, 4.6): one row per person's decision (`ApprovalDecision`); an
item is approved when `approvals_required` distinct people approved the same arguments in the
current round. What an edit does: approving with arguments that differ from the current
proposal (what the agent asked for, or an earlier approver's edit) makes them the new proposal
and starts a new round: earlier approvals were for other arguments, so the count starts again
from the editor (who counts as its first approval). Everyone, including earlier approvers, may
approve the new proposal. So whatever finally executes was approved, exactly as executed, by the
required number of different people. The number required is fixed when the item opens (from the
agent's arguments) and an edit can raise it, never lower it. The caller holds the approval row's
lock (`services.decide`), so two approvers racing for the last approval are serialised: the
second sees the item approved and loses.

Versions: every item carries `version` (1 when it opens, one more on every approval given, an
edit being one), so a decision names what the person saw. A decision on an older version changes
nothing (`StaleProposal`, a 409 with the current proposal, in every door). Without a version
(the JSON API only) a decision is accepted only while nobody has edited the arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import Tool
from agentruns.registry.edits import same_value
from agentruns.registry.outcomes import HandoverClosed
from agentruns.runtime import writer
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.execution import unknown_outcomes
from agentruns.runtime.execution.transitions import ABORT, RESUME, WAIT, resume_parked
from agentruns.runtime.operations import executions
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.calls import deployed_tool
from approvals.domain.decisions import approvers, args_diff
from approvals.domain.parking import operation_key_of, withdraw_approvals
from approvals.domain.policy import amount_of, check_approval, is_edit
from approvals.errors import AlreadyDecided, DecisionError, StaleProposal
from approvals.models import Approval, ApprovalDecision, ApprovalKind, ApprovalStatus, DecisionKind
from approvals.notifications import outbox

APPROVED = "approved"
CLOSED = "closed"


@dataclass
class Outcome:
    approval: Approval  # as settled (or, for a partial approval, as recorded)
    user: Any  # who decided (None: the system)
    decision: str  # the audit event's: approved, rejected, expired, "reconciled: retry"...
    then: str = RESUME  # the runtime's resume_parked: resume, wait (left as it is) or abort
    error: str = ""  # why the run ends (abort)
    args: Any = None  # the approved arguments (approved)
    edited: bool = False  # an approver changed the arguments (approved)
    extra: dict[str, Any] = field(default_factory=dict)  # more event fields (a reconciliation)
    after: list[EventSpec] = field(default_factory=list)  # (items withdrawn as the run aborts)
    progress: Progress | None = None  # a partial approval: its `approval.given` event instead

    def events(self) -> list[EventSpec]:
        """The run's timeline entries for this decision (arguments as people may see them)."""
        approval, given = self.approval, self.progress
        counted = approvers(approval) if self.decision == APPROVED and given is None else []
        shown = approval.effective_args if given is not None else self.args
        requested, proposal = approval.visible_args(), approval.redacted(shown)
        diff = args_diff(requested, proposal) if given is not None or self.edited else {}
        data: dict[str, Any] = {
            "approval": approval.id,
            "kind": approval.kind,
            "step": approval.step.index,
            "tool": approval.tool,
            "decision": self.decision,
            "by": actor_name(self.user),
        }
        if given is not None:
            # a partial approval: the run stays parked; the chat re-asks with the whole proposal
            data |= {
                "at": iso(given.decision.decided_at),
                "reason": given.decision.reason,
                "given": approval.approvals_given,
                "required": approval.approvals_required,
                "round": approval.round,
                "version": approval.version,
                "restarted": given.restarted,
                "diff": diff,
                "arguments": proposal,
            }
            return [(EventType.APPROVAL_GIVEN, data)]
        data |= {"at": iso(approval.decided_at), "reason": approval.reason}
        if self.decision == APPROVED:
            data |= {
                "requested": requested,
                "approved": proposal,
                "diff": diff,
                "edited": self.edited,
                "approvals": counted,
            }
        elif approval.kind == ApprovalKind.RECONCILIATION:
            data |= {"resolution": self.extra["resolution"], "requested": requested}
            data["result"] = self.extra["result"]
        else:
            data["requested"] = requested
        return [(EventType.APPROVAL_DECIDED, data), *self.after]

    def carry_out(self) -> bool:
        """The one call down: the events and what becomes of the run. Whether the run moved."""
        events = self.events()
        return resume_parked(self.approval.run_id, events, then=self.then, error=self.error)


# ------------------------------------------------------------------ first decision wins
def check_open(approval: Approval, kind: str, version: int | None = None) -> None:
    """The item can take this decision: still pending (else `AlreadyDecided`, naming who decided:
    a late click must learn that, not that its edits are invalid), of this `kind`, and (for an
    approval) decided on its current proposal: `version` as decisions.py's docstring says. The
    caller holds the row lock, so the version cannot move before the decision is recorded."""
    if approval.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(approval)
    if approval.kind != kind:
        raise DecisionError(f"this item is {_a(approval.kind)}, not {_a(kind)}", code="wrong_kind")
    if kind != ApprovalKind.APPROVAL:
        return
    if version is None:
        # has anybody changed the arguments of this item (then every decision must name one)?
        if approval.decisions.filter(edited=True).exists():
            raise StaleProposal(approval, None)
        return
    if version != approval.version:
        raise StaleProposal(approval, version)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def settle(approval: Approval, kind: str, user: Any, **changes: Any) -> Approval:
    """First decision wins: compare-and-set pending -> decided on the row, mirrored on
    `approval`; the loser gets AlreadyDecided (or wrong_kind) and nothing changes.

    The conditional UPDATE is the arbiter: on PostgreSQL a concurrent decider blocks on the row
    lock, re-reads `status` after the winner commits, matches nothing and loses.
    """
    changes |= {
        "decided_by": user if getattr(user, "is_authenticated", False) else None,
        "decided_at": timezone.now(),
    }
    won = Approval.objects.filter(id=approval.id, kind=kind, status=ApprovalStatus.PENDING).update(
        **changes
    )
    if not won:
        approval.refresh_from_db()
        check_open(approval, kind)
    for name, value in changes.items():
        setattr(approval, name, value)
    event = {
        ApprovalKind.HANDOVER: outbox.HANDOVER_CLOSED,
        ApprovalKind.QUESTION: outbox.QUESTION_ANSWERED,
    }.get(kind, outbox.APPROVAL_DECIDED)
    outbox.record(event, approval=approval)
    return approval


# ------------------------------------------------------------------ people's decisions
@dataclass
class Progress:
    decision: ApprovalDecision
    complete: bool  # the required count is reached: the caller settles the item as approved
    restarted: bool  # this approval changed the arguments and started a new round


def decision_row(approval: Approval, user: Any, decision: str, **fields: Any) -> ApprovalDecision:
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
    approval: Approval,
    user: Any,
    args: dict,
    reason: str,
    required: int,
    tool: Tool,
    internal_note: str = "",
) -> Progress:
    """Count `user`'s approval of `args` (checked by approvals.domain.policy) as the module's
    docstring says: `args` need `required` approvers (the tool's `approvals_required`); saves
    the counters. The row keeps the amount approved (an approver's total per day)."""
    restarted = is_edit(approval, args)
    if restarted:
        if approval.approvals_given:
            approval.round += 1
        approval.approvals_given = 0
        approval.edited_args = None if same_value(args, approval.requested_args) else args
        approval.operation_key = operation_key_of(approval.run, tool, args)
    # an edit can raise the number required, never lower it
    approval.approvals_required = max(approval.approvals_required, required)
    row = decision_row(
        approval,
        user,
        DecisionKind.APPROVE,
        args=args,
        edited=restarted,
        reason=reason,
        internal_note=internal_note,
        amount=amount_of(approval, tool, args),
    )
    approval.approvals_given += 1
    approval.version += 1
    approval.save(
        update_fields=[
            "round",
            "approvals_given",
            "approvals_required",
            "edited_args",
            "version",
            "operation_key",
        ]
    )
    return Progress(row, approval.approvals_given >= approval.approvals_required, restarted)


def record_rejection(
    approval: Approval, user: Any, reason: str, internal_note: str = ""
) -> ApprovalDecision:
    return decision_row(
        approval, user, DecisionKind.REJECT, reason=reason, internal_note=internal_note
    )


# ------------------------------------------------------------------ each decision
def approved(
    current: Approval, user: Any, edited_args: dict | None, reason: str, internal_note: str = ""
) -> Outcome:
    """The step keeps its idempotency key and runs with the approved arguments; the requested
    ones stay on the approval, the full approved set goes to `edited_args` when it differs."""
    args, tool = check_approval(current, user, edited_args)
    required = tool.approvals_for(args)
    progress = record_approval(current, user, args, reason, required, tool, internal_note)
    if not progress.complete:
        return partial(current, user, progress)
    edited = current.edited_args
    settle(
        current,
        ApprovalKind.APPROVAL,
        user,
        status=ApprovalStatus.APPROVED,
        reason=reason,
        internal_note=internal_note,
    )
    step = current.step
    step.arguments, step.approved, step.status = args, True, StepStatus.PENDING
    writer.save_step(step, ["arguments", "approved", "status"])
    return Outcome(current, user, APPROVED, args=args, edited=edited is not None)


def reconciled(
    approval: Approval,
    user: Any,
    resolution: str,
    result: Any,
    reason: str,
    internal_note: str = "",
) -> Outcome:
    """Staff say what happened to a call whose outcome is unknown (DESIGN.md 4.4), by the
    runtime's one rule for such steps (runtime/execution/unknown_outcomes.py).

    happened: the step succeeds with the given result (or a marker) and the run continues;
    retry: it did not happen, the step runs again (same idempotency key); abort: the run fails,
    nothing more runs, and the step stays unknown: no door runs it again.
    """
    who = actor_name(user) or "staff"
    happened = result if resolution == "happened" else None
    settle(
        approval,
        ApprovalKind.RECONCILIATION,
        user,
        status=ApprovalStatus.RESOLVED,
        resolution=resolution,
        resolution_result=happened,
        reason=reason,
        internal_note=internal_note,
    )
    step, now = approval.step, timezone.now()
    run = Run.objects.select_for_update().get(id=approval.run_id)
    outcome = Outcome(
        approval,
        user,
        f"reconciled: {resolution}",
        extra={"resolution": resolution, "result": happened},
    )
    if resolution == "happened":
        unknown_outcomes.happened(step, result, who=who, now=now)
        executions.settle(step.id, executions.DONE, step.result)  # the key it held: done
    elif resolution == "retry":
        # it runs again with the same idempotency key, still holding its operation key
        unknown_outcomes.did_not_happen(step, who=who)
    else:
        unknown_outcomes.abandoned(step, who=who, now=now)
        # nobody can say it did not happen: its key stays used (a lead may allow one more)
        unconfirmed = {"outcome_unknown": True, "note": f"aborted by {who}"}
        executions.settle(step.id, executions.DONE, unconfirmed)
    writer.save_step(step, ["status", "result", "finished_at", "error"])
    if resolution != "abort":
        return outcome
    # abort: the run ends here; steps planned after this one never run (one whose outcome is
    # unknown too stays so: skipping it would say it did not happen)
    writer.skip_unrun_steps(run, now, after=step.index)
    withdrawn = withdraw_approvals(run, reason=f"run aborted by {who}")
    outcome.after = [(EventType.APPROVAL_WITHDRAWN, {"approval": a}) for a in withdrawn]
    outcome.error = f"aborted by {who} after an unknown outcome of {step.tool}"
    # (a run cancelled meanwhile only gets the audit events)
    outcome.then = ABORT if run.status == RunStatus.WAITING else WAIT
    return outcome


def rejected(
    approval: Approval,
    user: Any,
    reason: str,
    status: str = ApprovalStatus.REJECTED,
    internal_note: str = "",
) -> Outcome:
    """Settle as rejected (or expired); the agent receives `{"error": "rejected", "reason": ...}`
    as the tool's result, so it can tell the customer why. The internal note stays on the item
    and its decision row: staff's, never the agent's. Inside the caller's transaction."""
    settle(
        approval,
        ApprovalKind.APPROVAL,
        user,
        status=status,
        reason=reason,
        internal_note=internal_note,
    )
    approval.step.reject(reason)
    writer.save_step(approval.step, Step.REJECTED_FIELDS)
    if status == ApprovalStatus.REJECTED:  # a person's decision (an expiry is nobody's): its row
        record_rejection(approval, user, reason, internal_note)
    return Outcome(approval, user, str(status))


def closed(approval: Approval, user: Any, reason: str, internal_note: str) -> Outcome:
    """A person is done with a hand-over: resolved ("closed") with their note. The run ended when
    it handed over (its outcome stays): only the audit event is added to its timeline."""
    settle(
        approval,
        ApprovalKind.HANDOVER,
        user,
        status=ApprovalStatus.RESOLVED,
        resolution=CLOSED,
        reason=reason,
        internal_note=internal_note,
    )
    decision_row(approval, user, DecisionKind.CLOSE, reason=reason, internal_note=internal_note)
    tell_tool_closed(approval)
    return Outcome(approval, user, CLOSED, then=WAIT)


def tell_tool_closed(approval: Approval) -> None:
    """The hand-over's tool hears that a person closed it (its `handover_closed`), in this
    transaction: the domain's record of the request (the demo's ticket) changes with the close
    or not at all, whichever door closed it. A tool gone with a deploy, or declaring none: no
    call."""
    tool = deployed_tool(approval.tool)
    if tool is None or tool.handover_closed is None:
        return
    run_input = approval.run.input
    tool.handover_closed(
        HandoverClosed(
            run_id=approval.run_id,
            tool=approval.tool,
            arguments=dict(approval.requested_args or {}),
            run_input=dict(run_input) if isinstance(run_input, dict) else {},
            closed_by=approval.decided_by,
            closed_at=approval.decided_at,
            reason=approval.reason,
            internal_note=approval.internal_note,
        )
    )


def partial(approval: Approval, user: Any, progress: Progress) -> Outcome:
    """A partial approval: on the run's timeline (`approval.given`) and the inbox, live; the
    run stays parked."""
    return Outcome(approval, user, APPROVED, then=WAIT, progress=progress)


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
                approval = Approval.objects.select_related("step", "run", "decided_by").get(
                    id=approval_id
                )
                rejected(approval, None, "expired", ApprovalStatus.EXPIRED).carry_out()
            expired += 1
        except AlreadyDecided:
            pass  # a person (or another sweeper) decided first
    return expired
