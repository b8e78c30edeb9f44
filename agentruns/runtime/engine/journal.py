"""The slice's journal: the one place where what a slice did reaches the database.

Every unit of the agent's loop (a model request: `model/unit.py`; a tool call: `tools/unit.py`;
a wait: `waits.py`) does its work and hands the journal what it did:

- rows and events that ride with the next commit (`state.pending`, built by `plan.py`);
- a commit that must happen now (a side effect's "before" and "after", a transactional tool's
  result in its own transaction, a model attempt's first text): `commit`, the one fenced
  statement (the lease renewed, the event seqs allocated, the cancel flag read, everything
  pending first), on the slice's lane;
- the slice's end, an `End`: the loop returned (`Finished`), a verdict (`Failed`), a stop
  (`Cancelled`), a park for a person or an event (`Parked`), a yield (`Yielded`), a back-off
  without a thread (`BackingOff`), an outcome nobody can know (`Reconciled`). `end` makes the
  slice's last commit where the unit decided it (`raise await ended(...)`), and the
  `SliceEnds` it returns unwinds the agent's loop carrying only the outcome. A unit whose end is
  more than a status (an inbox item, a wait row) makes those writes in the same transaction and
  calls `park` there.

The boundary a unit checks before it executes (`due`, then `check`): the lease (`LeaseLost`), a
cancel the last commit read, the run's deadline, before a model request its max steps and token
and cost budgets, then the time slice and a draining pool (the run yields).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

from django.db import transaction
from django.utils import timezone
from pydantic_ai.durable_exec import record_durable_unit
from pydantic_core import to_jsonable_python

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, JournalEntry, Run, RunStatus, Step, StepStatus
from agentruns.runtime import writer
from agentruns.runtime.conversations import transcript
from agentruns.runtime.dispatch import thread_line
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.engine import resume
from agentruns.runtime.engine.plan import end_attempt, journal_text, replayed, stage
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import EventSpec, EventType, LeaseLost, step_event_data
from agentruns.runtime.execution import transitions
from agentruns.runtime.execution.cancel import (
    cancel_run,
    requested_stop_reason,
    withdraw_unrun_work,
)
from agentruns.runtime.execution.transitions import ActionRefused, RunChange
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.text import storable


# ------------------------------------------------------------------ the slice's ends
@dataclass(frozen=True, slots=True)
class Finished:
    """The agent's loop returned: the run succeeded with its output."""

    result: Any


@dataclass(frozen=True, slots=True)
class Failed:
    error: str
    stop_reason: str = ""


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Cancelled (or stopped) at a boundary, or in a model turn it cut short, whose text so far
    is the run's `output`."""

    output: str = ""


@dataclass(frozen=True, slots=True)
class Parked:
    events_before: list[EventSpec] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Yielded:
    reason: str = "time slice"


@dataclass(frozen=True, slots=True)
class BackingOff:
    """Queued again without a thread; its doorbell rings at `until`. `why`: what the backing-off
    event says (the reason, an outage's or a rate limit's state)."""

    until: datetime
    why: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Nobody can tell whether `step`'s call took effect (DESIGN.md 4.5)."""

    step: Step
    why: str


@runtime_checkable
class UnitEnd(Protocol):
    """An end whose commit only its unit knows (a wait inside a tool's call: the call gives back
    its attempt and key, and the wait row goes with the park), made by that unit."""

    def end(self, state: SliceState) -> str: ...


End = Finished | Failed | Cancelled | Parked | Yielded | BackingOff | Reconciled | UnitEnd


def end(state: SliceState, ending: End) -> str:
    """The slice's last commit for `ending` (on its lane); returns the slice's outcome."""
    match ending:
        case Finished(result=result):
            return _finished_with(state, result)
        case Failed(error=error, stop_reason=stop_reason):
            return finish(state, RunStatus.FAILED, error=error, stop_reason=stop_reason)
        case Cancelled(output=output):
            return _cancelled(state, output)
        case Parked(events_before=events):
            return park(state, events_before=events)
        case Yielded(reason=reason):
            return _yielded(state, reason)
        case BackingOff(until=until, why=why):
            return back_off(state, until, **why)
        case Reconciled(step=step, why=why):
            return _reconciled(state, step, why)
        case UnitEnd():
            return ending.end(state)
    raise TypeError(f"not a slice's end: {ending!r}")


async def ended(state: SliceState, ending: End) -> SliceEnds:
    """`end` on the lane; what the unit raises to unwind the agent's loop."""
    return SliceEnds(await state.lane.run(end, state, ending))


# ------------------------------------------------------------------ the fenced commit
def commit(
    state: SliceState,
    events: list[EventSpec],
    *,
    batch: WriteBatch | None = None,
    end_transaction: bool = False,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
) -> int:
    """The fenced run UPDATE + events, with the writes in `batch` and everything the slice has
    done but not committed yet (its pending batch, first), as one transaction.

    It renews the lease (unless `set_fields` releases it), allocates the seqs and reads the
    cancel flag, or raises LeaseLost (rolling the transaction back) when the lease is no longer
    ours. `end_transaction`: the caller's atomic block ends right after this."""
    now = timezone.now()
    fields = dict(set_fields or {})
    incr = dict(incr_fields or {})
    entries: list[Any] = []
    if state.pending:
        pending = state.pending.take()
        entries = pending.journal
        if batch is not None:  # (a row both stage is inserted once: the pending one)
            ids = {id(row) for row in pending.batch.inserts}
            pending.batch.insert([row for row in batch.inserts if id(row) not in ids])
            pending.batch.updates.extend(batch.updates)
        batch = pending.batch
        events = [*pending.events, *events]
        fields = {**pending.set_fields, **fields}
        incr = _merged(pending.incr_fields, incr)
    if "lease_owner" not in fields:
        fields["lease_expires_at"] = now + timedelta(seconds=state.ttl)
    # an end lets the run's concurrency key and its thread's turn go in the same transaction
    # (nothing without them)
    with (
        transaction.atomic(savepoint=False) if entries else nullcontext(),
        thread_line.following(state.run_id, fields.get("status"), state.run_key, state.thread_id),
    ):
        if entries:
            writer.save_journal(entries)
        last_seq, state.cancel_requested = writer.commit(
            state.run_id,
            state.owner,
            events,
            now=now,
            set_fields=fields,
            incr_fields=incr or None,
            batch=batch,
            end_transaction=end_transaction and not entries,
        )
    if state.heartbeat is not None:
        state.heartbeat.renewed()
    return last_seq


def _merged(first: dict[str, Any], second: dict[str, Any] | None) -> dict[str, Any]:
    """Two sets of run increments as one (a cost is a Decimal, counts are ints)."""
    out = dict(first)
    for name, value in (second or {}).items():
        out[name] = out[name] + value if name in out else value
    return out


def check_lease(state: SliceState) -> None:
    if state.heartbeat is not None and state.heartbeat.lost.is_set():
        raise LeaseLost(str(state.run_id))


# ------------------------------------------------------------------ the boundary
def due(state: SliceState, *, model: bool, begun: bool = False) -> End | None:
    """The slice's end when it must not go on to execute a unit (see the module); raises
    LeaseLost when the lease is gone. `begun`: the unit's work began in an earlier commit (a
    side effect under way is not left for a yield)."""
    check_lease(state)
    if state.cancel_requested:
        return Cancelled()
    run = state.run
    if run.deadline_at and timezone.now() >= run.deadline_at:
        return Failed("the run's deadline passed", stop_reason="deadline")
    if model and (stop := _stop_condition(state)) is not None:
        return Failed(stop[1], stop_reason=stop[0])
    if not begun and state.slice_over():
        draining = state.drain is not None and state.drain.is_set()
        return Yielded("worker draining") if draining else Yielded()
    return None


async def check(state: SliceState, *, model: bool, begun: bool = False) -> None:
    """Raise the slice's end (made) when one is due before a unit executes."""
    if (ending := due(state, model=model, begun=begun)) is not None:
        raise await ended(state, ending)


def check_now(state: SliceState, *, model: bool, begun: bool = False) -> None:
    """`check` for blocking code already on the lane."""
    if (ending := due(state, model=model, begun=begun)) is not None:
        raise SliceEnds(end(state, ending))


def _stop_condition(state: SliceState) -> tuple[str, str] | None:
    """Before a new model request: max steps, the token budget, the cost budget."""
    run = state.run
    if len(state.steps) >= run.max_steps:
        return (
            "max_steps",
            f"stopped after {len(state.steps)} steps (max_steps={run.max_steps})",
        )
    budget = run.token_budget
    if budget and run.total_tokens >= budget:
        return "token_budget", f"token budget exhausted ({run.total_tokens} of {budget})"
    limit = getattr(state.agent, "max_cost_usd", None)
    max_cost = Decimal(str(limit if limit is not None else conf.MAX_COST_USD or 0))
    if max_cost and run.cost_usd >= max_cost:
        return "cost_budget", f"cost budget exhausted (${run.cost_usd} of ${max_cost})"
    return None


async def wait_for_retry(state: SliceState, due_at: Any) -> bool:
    """Sleep until a short retry is due, noticing a cancel meanwhile (False: cancelled)."""
    while (delay := (due_at - timezone.now()).total_seconds()) > 0:
        await asyncio.sleep(min(delay, 0.5))
        check_lease(state)
        if await state.lane.run(_cancel_requested, state.run_id):
            return False
    return True


def sleep_until(state: SliceState, due_at: Any) -> bool:
    """`wait_for_retry` for blocking code on the lane (a sync tool's short timer)."""
    while (delay := (due_at - timezone.now()).total_seconds()) > 0:
        time.sleep(min(delay, 0.5))
        check_lease(state)
        if _cancel_requested(state.run_id):
            return False
    return True


def _cancel_requested(run_id: Any) -> bool:
    return Run.objects.filter(id=run_id, cancel_requested=True).exists()


# ------------------------------------------------------------------ the run's status changes
def apply(
    state: SliceState,
    change: RunChange,
    *,
    events_before: list[EventSpec] = (),
    held: bool = False,
) -> int:
    """Commit a change of the run's status, after `events_before`. `held`: the slice's run and
    steps are the run's as it ends (its outcome and hand-overs are then decided from them,
    without reading the run and its steps again)."""
    run, steps = (state.run, state.steps) if held else (None, None)
    # rolled back with the commit if it fails
    transitions.announce(state.run_id, change, run=run, steps=steps)
    return commit(state, [*events_before, *change.events], set_fields=change.fields)


def finish(
    state: SliceState,
    status: str,
    *,
    output: str = "",
    output_data: Any = None,
    error: str = "",
    stop_reason: str = "",
    answered: bool = False,
) -> str:
    """`answered`: the agent's loop returned, so the slice holds every step of the run as it
    ends."""
    with transaction.atomic(savepoint=False):
        resume.forget(state)
        executions.run_ended(state.run or state.run_id, f"the run ended ({status})")
        apply(
            state,
            transitions.finished(
                status,
                output=output,
                output_data=output_data,
                error=error,
                stop_reason=stop_reason,
            ),
            held=answered,
        )
    return status


def _finished_with(state: SliceState, result: Any) -> str:
    """The run's output: text, or the validated object of a structured `output_type` as JSON."""
    output = result.output
    if isinstance(output, str):
        return finish(state, RunStatus.SUCCEEDED, output=output, answered=True)
    data = storable(to_jsonable_python(output))
    text = json.dumps(data, ensure_ascii=False)
    return finish(state, RunStatus.SUCCEEDED, output=text, output_data=data, answered=True)


def park(state: SliceState, *, events_before: list[EventSpec] = ()) -> str:
    with transaction.atomic(savepoint=False):
        resume.store(state)
        apply(state, transitions.parked(), events_before=events_before)
        if state.cancel_requested:
            # a cancel arrived while we were parking: now that nobody executes the run it can
            # be cancelled for real (and its fresh inbox item withdrawn)
            run_id = state.run_id
            transaction.on_commit(lambda: _cancel_parked(run_id))
    return RunStatus.WAITING


def _cancel_parked(run_id: Any) -> None:
    try:
        cancel_run(run_id, reason="cancelled while parking")
    except ActionRefused:
        pass


def _yielded(state: SliceState, reason: str) -> str:
    with transaction.atomic(savepoint=False):
        resume.store(state)
        apply(state, transitions.yielded(timezone.now(), reason=reason))
        enqueue(state.run_id)
    return RunStatus.QUEUED


def back_off(state: SliceState, until: Any, **why: Any) -> str:
    """Wait for a retry without a thread: queued again, its doorbell rings at `until`."""
    with transaction.atomic(savepoint=False):
        resume.store(state)
        apply(state, transitions.backing_off(until, **why))
        enqueue(state.run_id, not_before=until)
    return RunStatus.QUEUED


def _cancelled(state: SliceState, output: str) -> str:
    """Steps nobody will run are skipped (those the slice planned but has not committed yet
    too), inbox items withdrawn. The stop reason says whether it was a stop."""
    now = timezone.now()
    reason = requested_stop_reason(state.run_id)
    with transaction.atomic(savepoint=False):
        for step in state.steps:
            if step._state.adding and step.status in (
                StepStatus.PENDING,
                StepStatus.WAITING_APPROVAL,
            ):
                step.status, step.finished_at = StepStatus.SKIPPED, now
        events = withdraw_unrun_work(state.run, now, who=None, verb=reason)
        # a thread's run: what it did, for the next turn's model
        transcript.record_unanswered(state.run.id, state.run.thread_id, state.steps)
        executions.run_ended(state.run, "the run was cancelled during the call")
        apply(
            state,
            transitions.finished(
                RunStatus.CANCELLED, output=output, stop_reason=reason, error=f"{reason} on request"
            ),
            events_before=events,
        )
    return RunStatus.CANCELLED


def _reconciled(state: SliceState, step: Step, why: str) -> str:
    """The step is `unknown`, a reconciliation item goes to the inbox and the run waits for a
    person. Never guessed."""
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
            state,
            events_before=[
                (EventType.STEP_UNKNOWN, step_event_data(step)),
                (EventType.APPROVAL_REQUESTED, {"step": step.index, "kind": "reconciliation"}),
            ],
        )


# ------------------------------------------------------------------ the units that are not steps
async def journal_unit(state: SliceState, name: str, body: Callable[[], Awaitable[object]]) -> Any:
    """A unit that is not a step (discovery, an event handler, a capability's operation): the
    n-th of the run is its n-th journal entry."""
    position = state.entries_seen
    state.entries_seen += 1
    if position < len(state.entries):
        record_durable_unit(executed=False)
        return replayed(state.entries[position].payload)
    check_lease(state)
    payload = await body()
    entry = JournalEntry(run_id=state.run.id, ordinal=position, name=name[:300])
    entry.payload = journal_text(payload)
    state.entries.append(entry)
    state.pending.journal.append(entry)
    record_durable_unit(executed=True)
    return payload
