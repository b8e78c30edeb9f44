"""How a slice ends: the run's status changes an executor commits (`transitions.py` has the
fields and events of each), each with everything the slice has not committed yet, and the
boundary every unit checks before it executes.

A unit that ends the slice raises `ends(...)` (a `SliceEnds` carrying the commit), so the
commit is made by the executor once the agent's loop has unwound; `finished_with` is the end of
a loop that returned: the run's output, in the commit that also records its last model step.

The boundary (`check_boundary`), before a unit executes, in this order: the lease, a cancel the
last commit read (cancelled at this boundary), the run's deadline, before a model request its
max steps and token and cost budgets (each ends the run with its stop reason), then the time
slice and a draining pool (the run yields its thread).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic_core import to_jsonable_python

from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepStatus
from agentruns.runtime.conversations import transcript
from agentruns.runtime.dispatch import connections
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.engine.plan import end_attempt, stage
from agentruns.runtime.engine.slice import SliceEnds
from agentruns.runtime.events import EventSpec, EventType, step_event_data
from agentruns.runtime.execution import transitions
from agentruns.runtime.execution.cancel import (
    cancel_run,
    requested_stop_reason,
    withdraw_unrun_work,
)
from agentruns.runtime.execution.transitions import ActionRefused, RunChange
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.values.text import storable


def ends(outcome: str, commit: Callable[[], str]) -> SliceEnds:
    return SliceEnds(outcome, commit)


def apply(
    executor: Any,
    change: RunChange,
    *,
    events_before: list[EventSpec] = (),
    held: Any = None,
) -> int:
    """Commit a change of the run's status, after `events_before`. `held`: the slice's state,
    when its run and steps are the run's as they end (its outcome and hand-overs are then
    decided from them, without reading the run and its steps again)."""
    run, steps = (held.run, held.steps) if held is not None else (None, None)
    # rolled back with the commit if it fails
    transitions.announce(executor.run_id, change, run=run, steps=steps)
    return executor.commit([*events_before, *change.events], set_fields=change.fields)


def finish(
    executor: Any,
    status: str,
    *,
    output: str = "",
    output_data: Any = None,
    error: str = "",
    stop_reason: str = "",
    answered: bool = False,
) -> str:
    """`answered`: the agent's loop returned, so the slice holds every step of the run as it
    ends (the final answer's end, as the old loop's was)."""
    with transaction.atomic(savepoint=False):
        state = executor.state  # None when the slice failed loading
        executions.run_ended(state.run if state else executor.run_id, f"the run ended ({status})")
        apply(
            executor,
            transitions.finished(
                status,
                output=output,
                output_data=output_data,
                error=error,
                stop_reason=stop_reason,
            ),
            held=state if answered else None,
        )
    return status


def finished_with(executor: Any, result: Any) -> str:
    """The agent's loop returned: the run succeeded with its output (text, or the validated
    object of a structured `output_type` as JSON)."""
    output = result.output
    if isinstance(output, str):
        return finish(executor, RunStatus.SUCCEEDED, output=output, answered=True)
    data = storable(to_jsonable_python(output))
    text = json.dumps(data, ensure_ascii=False)
    return finish(executor, RunStatus.SUCCEEDED, output=text, output_data=data, answered=True)


def fail(executor: Any, error: str, *, stop_reason: str = "") -> SliceEnds:
    return ends(
        RunStatus.FAILED,
        lambda: finish(executor, RunStatus.FAILED, error=error, stop_reason=stop_reason),
    )


def park(executor: Any, *, events_before: list[EventSpec] = ()) -> str:
    with transaction.atomic(savepoint=False):
        apply(executor, transitions.parked(), events_before=events_before)
        if executor.cancel_requested:
            # a cancel arrived while we were parking: now that nobody executes the run it can
            # be cancelled for real (and its fresh inbox item withdrawn)
            run_id = executor.run_id
            transaction.on_commit(lambda: _cancel_parked(run_id))
    return RunStatus.WAITING


def _cancel_parked(run_id: Any) -> None:
    try:
        cancel_run(run_id, reason="cancelled while parking")
    except ActionRefused:
        pass


def yield_slice(executor: Any, reason: str = "time slice") -> str:
    with transaction.atomic(savepoint=False):
        apply(executor, transitions.yielded(timezone.now(), reason=reason))
        enqueue(executor.run_id)
    return RunStatus.QUEUED


def back_off(executor: Any, until: Any, **why: Any) -> str:
    """Wait for a retry without a thread: queued again, its doorbell rings at `until`."""
    with transaction.atomic(savepoint=False):
        apply(executor, transitions.backing_off(until, **why))
        enqueue(executor.run_id, not_before=until)
    return RunStatus.QUEUED


def cancel_at_boundary(executor: Any, *, output: str = "") -> str:
    """Cancelled between two units (or in a model turn it cut short, whose text so far is the
    run's `output`): steps nobody will run are skipped (those the slice planned but has not
    committed yet too), inbox items withdrawn. The stop reason says whether it was a stop."""
    now = timezone.now()
    reason = requested_stop_reason(executor.run_id)
    state = executor.state
    with transaction.atomic(savepoint=False):
        if state is not None:
            for step in state.steps:
                if step._state.adding and step.status in (
                    StepStatus.PENDING,
                    StepStatus.WAITING_APPROVAL,
                ):
                    step.status, step.finished_at = StepStatus.SKIPPED, now
        events = withdraw_unrun_work(executor.state.run, now, who=None, verb=reason)
        if state is not None:  # a thread's run: what it did, for the next turn's model
            transcript.record_unanswered(state.run.id, state.run.thread_id, state.steps)
        executions.run_ended(executor.state.run, "the run was cancelled during the call")
        apply(
            executor,
            transitions.finished(
                RunStatus.CANCELLED, output=output, stop_reason=reason, error=f"{reason} on request"
            ),
            events_before=events,
        )
    return RunStatus.CANCELLED


def cancelled(executor: Any, *, output: str = "") -> SliceEnds:
    return ends(RunStatus.CANCELLED, lambda: cancel_at_boundary(executor, output=output))


def outcome_unknown(executor: Any, step: Step, why: str) -> SliceEnds:
    """Nobody can tell whether the call took effect: the step is `unknown`, a reconciliation
    item goes to the inbox and the run waits for a person (DESIGN.md 4.5). Never guessed."""

    def commit() -> str:
        state = executor.state
        batch = state.pending.batch
        end_attempt(
            batch,
            step,
            step.attempts,
            outcome=AttemptOutcome.UNKNOWN,
            error=why,
            finished_at=timezone.now(),
        )
        step.status = StepStatus.UNKNOWN
        stage(batch, step, ["status"])
        with transaction.atomic():
            inbox().open_reconciliation(step, state.run.agent)
            return park(
                executor,
                events_before=[
                    (EventType.STEP_UNKNOWN, step_event_data(step)),
                    (EventType.APPROVAL_REQUESTED, {"step": step.index, "kind": "reconciliation"}),
                ],
            )

    return ends(RunStatus.WAITING, commit)


# ------------------------------------------------------------------ the boundary
def check_boundary(state: Any, *, model: bool, begun: bool = False) -> None:
    """Raise the slice's end when it must not go on to execute a unit (see the module)."""
    executor = state.executor
    executor.check_lease()
    if executor.cancel_requested:
        raise cancelled(executor)
    run = state.run
    if run.deadline_at and timezone.now() >= run.deadline_at:
        raise fail(executor, "the run's deadline passed", stop_reason="deadline")
    if model and (stop := executor.stop_condition()) is not None:
        raise fail(executor, stop[1], stop_reason=stop[0])
    if not begun and state.slice_over():
        reason = "worker draining" if state.drain is not None and state.drain.is_set() else None
        raise ends(
            RunStatus.QUEUED,
            lambda: yield_slice(executor, reason) if reason else yield_slice(executor),
        )


def wait_for_retry(executor: Any, due: Any) -> bool:
    """Sleep until a short retry is due, noticing a cancel meanwhile (False: cancelled)."""
    while (delay := (due - timezone.now()).total_seconds()) > 0:
        connections.release()
        time.sleep(min(delay, 0.5))
        executor.check_lease()
        if Run.objects.filter(id=executor.run_id, cancel_requested=True).exists():
            return False
    return True
