"""Before a tool call is made: its operation key and limit (a gated tool: made, answered with
the key's earlier execution, refused, or the run waits for the call holding the key), its
"before" commit (a side effect outside this database: running + attempt), a cancel read by that
commit (not made); and the answers of a call that is not made (`recorded`, `_refuse`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic_ai.durable_exec import (
    record_durable_unit,
)

from agentruns.models import AttemptOutcome, RunStatus, Step, StepStatus
from agentruns.registry import (
    Tool,
)
from agentruns.runtime.engine import status
from agentruns.runtime.engine.plan import (
    begin_attempt,
    end_attempt,
    replayed,
    stage,
)
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import EventType, step_event_data, succeeded_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.operations import executions
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.store.rows import WriteBatch

TOOL_RESULT_FIELDS = [
    "status",
    "result",
    "payload",
    "error",
    "attempts",
    "started_at",
    "finished_at",
    "next_attempt_at",
]


# the control flow a tool raised, as Pydantic AI records it: what the step keeps as its result
def recorded(step: Step) -> Any:
    """What a succeeded (or refused) tool step returns on replay (the JSON codec's form)."""
    if step.payload is not None:
        return replayed(step.payload)
    return {"kind": "tool_return", "result": step.result}


def _refuse(state: SliceState, step: Step, reason: str) -> Any:
    """The call is not made: the step ends rejected with `reason`, the model's answer."""
    step.reject(reason)
    stage(state.pending.batch, step, list(Step.REJECTED_FIELDS))
    state.executor.commit([(EventType.STEP_FAILED, step_event_data(step))])
    record_durable_unit(executed=True)
    return recorded(step)


_GO, _AGAIN = object(), object()


def _open(state: SliceState, step: Step, tool: Tool, attempt: int, started: Any) -> Any:
    """Before the call: its operation key and limit (a gated tool), its "before" commit (a side
    effect outside this database). `_GO`: make the call; `_AGAIN`: the key it waited for was
    settled meanwhile; anything else: the call's answer without it being made."""
    executor = state.executor
    if operations.gated(state.run, tool):
        # the key is taken (and the limit checked) in the "before" commit, with everything the
        # slice has not committed yet: a crash leaves the key held by the step, resumed with it
        with transaction.atomic():
            first = attempt == step.retry_base + 1
            gate = operations.gate(state.run, step, tool, first_attempt=first)
            if gate.go and tool.commits_before_call:
                _begin(state, step, attempt, started, end_transaction=True)
            elif state.pending:
                executor.commit([], end_transaction=True)
        if not gate.go:
            answer = _not_made_by_gate(state, step, gate)
            return _AGAIN if answer is None else answer
    elif tool.commits_before_call:
        _begin(state, step, attempt, started)
    if tool.commits_before_call and executor.cancel_requested:
        _not_made(state, step, attempt)  # read by the "before" commit: the call is not made
        raise status.cancelled(executor)
    failpoints.hit("step_started", tool=step.tool, step_id=step.id)
    return _GO


def _begin(
    state: SliceState, step: Step, attempt: int, started: Any, *, end_transaction: bool = False
) -> None:
    """The "before" commit: running + attempt, so a crash is seen and resumed by class."""
    step.status = StepStatus.RUNNING
    batch = WriteBatch()
    begin_attempt(batch, step, attempt, state.executor.owner, started)
    state.executor.commit(
        [(EventType.STEP_STARTED, step_event_data(step, error=""))],  # not a retry's old one
        batch=batch,
        end_transaction=end_transaction,
    )


def _not_made_by_gate(state: SliceState, step: Step, gate: operations.Gate) -> Any:
    """The gate kept the call from being made: refused (the model reads why), answered with
    the key's earlier execution (the step succeeds with it, marked already done), or the run
    waits for the call that holds the key, holding no thread (None: it was settled meanwhile,
    take it again)."""
    executor = state.executor
    if gate.outcome == operations.REFUSED:
        return _refuse(state, step, gate.reason)
    if gate.outcome == operations.DONE:
        now = timezone.now()
        step.status, step.error, step.next_attempt_at = StepStatus.SUCCEEDED, "", None
        step.result = operations.already_done(gate.key, gate.row)
        step.payload = None  # replayed from its result
        step.started_at, step.finished_at = step.started_at or now, now
        stage(state.pending.batch, step, TOOL_RESULT_FIELDS)
        executor.commit([(EventType.STEP_SUCCEEDED, succeeded_event_data(state.run, step))])
        record_durable_unit(executed=True)
        return recorded(step)
    until = timezone.now() + timedelta(seconds=operations.WAIT_POLL_SECONDS)
    with transaction.atomic():
        if not executions.wait_for(gate.row.id, executor.run_id):
            return None
        # on the key's waiters: the run is rung when it settles (its settle waits for this
        # transaction), so the back-off is committed in it
        status.back_off(executor, until, waiting=gate.reason, operation_key=gate.key)
    raise SliceEnds(RunStatus.QUEUED)  # committed here


def _not_made(state: SliceState, step: Step, attempt: int) -> None:
    not_made = "the run was cancelled before the call was made"
    if operations.holds_key(state.run, step.tool):
        with transaction.atomic():  # never made: the key is free again
            executions.settle(step.id, executions.RELEASED)
    now = timezone.now()
    batch = state.pending.batch
    end_attempt(
        batch, step, attempt, finished_at=now, outcome=AttemptOutcome.FAILED, error=not_made
    )
    step.status, step.error, step.finished_at = StepStatus.FAILED, not_made, now
    stage(batch, step, ["status", "error", "finished_at"])
    state.pending.events.append((EventType.STEP_FAILED, step_event_data(step)))
