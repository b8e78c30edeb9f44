"""The executor's gate before a call whose tool declares an operation key or a limit
(registry/operations.py), inside the transaction of the call's "before" commit:

- the key, from the call's final (possibly edited) arguments, is taken: the call runs (`GO`);
  or every slot of the key was executed: the call is not made and the step succeeds with the
  earlier execution's result marked as already done (`DONE`); or another call holds the key:
  the run waits for it (`WAIT`), holding no thread, and is rung when that call settles;
- the limit is checked while the call holds its key, so calls sharing a key are checked one
  after the other with the earlier ones settled: over it, the call is refused with the figures
  and the model is told (`REFUSED`).

Why the second call waits for a held key rather than being told "in progress": the first call
is seconds from its outcome, and that outcome decides the second (done: it is answered with
the first's result; failed for good: the key is free and it runs). An unknown outcome holds the
key until a person reconciles it, and the waiting run says so. A call parked for approval holds
no key: a person may take hours, and whichever approved call runs first executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentruns.models import OperationExecution, Run, Step, StepStatus
from agentruns.registry import OperationKeyError, OverLimit, Tool, get_tool, has_tool
from agentruns.registry.operations import operation_key_of, over_limit
from agentruns.runtime.operations import executions
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.values.timestamps import iso

GO, DONE, WAIT, REFUSED = "go", "done", "wait", "refused"
# a waiting run is rung when the key it waits for is settled; this is the backstop of a lost
# doorbell (a settle whose transaction committed just before the waiter was listed is seen by
# the waiter itself, which then takes the key at once)
WAIT_POLL_SECONDS = 30.0


@dataclass
class Gate:
    outcome: str
    key: str | None = None
    row: OperationExecution | None = None  # DONE: the execution that answers; WAIT: the holder
    reason: str = ""  # REFUSED: what the model is told; WAIT: what the run waits for
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def go(self) -> bool:
        return self.outcome == GO


def key_of(run: Run, step: Step, tool: Tool) -> str | None:
    """The call's operation key (`key_for` its arguments)."""
    return key_for(run, tool, step.arguments)


def key_for(run: Run, tool: Tool, arguments: dict) -> str | None:
    """The operation key of a call of `tool` in `run` with `arguments`, or None when it takes
    none. The run's frozen policy says whether it does (a run from before keys existed follows
    the deployed tool); one that says so while the deployed tool declares none fails closed
    (OperationKeyError), as it could not be deduplicated."""
    frozen = run.tool_policy(tool.name).get("operation_key")
    if frozen is False:
        return None
    if tool.operation_key is None:
        if frozen:
            raise OperationKeyError(
                f"the run's policy gives {tool.name} an operation key, and the deployed tool "
                "declares none: the call could not be deduplicated"
            )
        return None
    return operation_key_of(tool.name, tool.operation_key, arguments)


def gated(run: Run, tool: Tool) -> bool:
    """Does a call of `tool` in `run` pass the gate (no query: the policy and the declaration)?"""
    return tool.limit is not None or holds_key(run, tool.name)


def holds_key(run: Run, tool_name: str) -> bool:
    """May a call of `tool_name` in `run` hold an operation key (its settle must be written)?"""
    frozen = run.tool_policy(tool_name).get("operation_key")
    if frozen is not None:
        return bool(frozen)
    return has_tool(tool_name) and get_tool(tool_name).operation_key is not None


def answered_already(run: Run, tool: Tool, arguments: dict) -> bool:
    """Is every slot of the call's operation key executed, so the call would be answered with
    the key's earlier execution instead of being made? Then nobody is asked to approve it
    (DESIGN.md 4.13: a call whose key is done never reaches the inbox again): it goes straight
    to the gate, which answers it "already done". No query for a tool without a key."""
    if not holds_key(run, tool.name):
        return False
    try:
        key = key_for(run, tool, arguments)
    except OperationKeyError:
        return False  # the gate refuses it; the approval rule stands meanwhile
    return key is not None and executions.key_state(key).status == "used"


def gate(run: Run, step: Step, tool: Tool, *, first_attempt: bool) -> Gate:
    """Take the call's key and check its limit (module docstring), inside the caller's
    transaction. `first_attempt`: the first attempt of the step since it was planned or retried
    by hand (the limit of a call without a key is checked then; a keyed call's when it takes
    its key afresh: a call resumed after a crash may have been made already, and its own effect
    must not count against it)."""
    try:
        key = key_of(run, step, tool)
    except OperationKeyError as exc:
        return Gate(REFUSED, reason=f"refused: {exc}; the call was not made")
    check_limit = tool.limit is not None and first_attempt
    if key is not None:
        claim = executions.take(key, run_id=run.id, step_id=step.id, tool=step.tool)
        if isinstance(claim, executions.Used):
            return Gate(DONE, key, claim.row)
        if isinstance(claim, executions.Busy):
            return Gate(WAIT, key, claim.row, reason=_waiting(key, claim.row))
        check_limit = tool.limit is not None and claim.fresh
    if check_limit:
        over = _over_limit(tool, step.arguments)
        if over is not None:
            if key is not None:
                executions.settle(step.id, executions.RELEASED)  # never made: the slot is free
            return Gate(
                REFUSED,
                key,
                reason=f"refused: {over.message}; the call was not made",
                figures=over.figures,
            )
    return Gate(GO, key)


def _over_limit(tool: Tool, arguments: dict) -> OverLimit | None:
    try:
        return over_limit(tool.name, tool.limit, arguments)
    except Exception as exc:
        if is_infrastructure_error(exc):
            raise  # the database blinked: weather, the slice stops without a verdict
        return OverLimit(f"{tool.name}: its limit could not be checked ({type(exc).__name__})")


def _waiting(key: str, holder: OperationExecution) -> str:
    status = Step.objects.filter(id=holder.step_id).values_list("status", flat=True).first()
    since = iso(holder.created_at)
    who = f"run {str(holder.run_id)[:8]}"
    if status == StepStatus.UNKNOWN:
        return (
            f"waiting for {key}: the outcome of {who}'s call (since {since}) is unknown until "
            "someone reconciles it in the inbox"
        )
    return f"waiting for {key}: {who} is executing it (since {since})"


def already_done(key: str, row: OperationExecution) -> dict[str, Any]:
    """What a call of a used key returns to its model: the earlier execution's result, marked."""
    result = row.result
    unknown = isinstance(result, dict) and result.get("outcome_unknown")
    at = iso(row.settled_at or row.created_at)
    what = "was already done" if not unknown else "may already have been done (never confirmed)"
    return {
        "already_done": True,
        "operation_key": key,
        "done_by_run": str(row.run_id),
        "done_at": at,
        "result": result,
        "message": (
            f"not done again: {key} {what} by run {str(row.run_id)[:8]} at {at}; "
            "a lead may allow one more execution"
        ),
    }


def resolved_by_hand(run: Run, step: Step, result: Any) -> None:
    """A failed call a person made by hand (`services.resolve_step`): its key, if it takes one,
    is done with that result, so the next call of the key is answered with it."""
    if not holds_key(run, step.tool) or not has_tool(step.tool):
        return
    try:
        key = key_of(run, step, get_tool(step.tool))
    except OperationKeyError:
        return
    if key is not None:
        executions.done_by_hand(key, run_id=run.id, step_id=step.id, tool=step.tool, result=result)
