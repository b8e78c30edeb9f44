"""Cancelling (or stopping) a run: at once when nobody executes it; otherwise the model turn in
flight is cancelled within a second (`dispatch/stops.py`) and a tool call in flight finishes
first (its exactly-once promise), the run ending at the next step boundary.

Called by the cancel and stop services (the run page, the API, the chat) and by the executor
itself when a cancel arrived while it was parking the run. A stop is a cancel its run's starter
may ask for; it ends the run with the stop reason "stopped" instead of "cancelled".
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from agentruns.models import AttemptOutcome, Run, RunEvent, RunStatus, Step, StepStatus
from agentruns.runtime import tracing, writer
from agentruns.runtime.dispatch import concurrency, stops
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.execution.transitions import ActionRefused, RunChange, apply, cancelled
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions

STOPPED, CANCELLED = "stopped", "cancelled"  # the run's stop reason after a stop, a cancel


def cancel_run(
    run_id: uuid.UUID | str, *, who: str | None = None, reason: str = "", stop: bool = False
) -> Run:
    """Cancel (`stop`: stop) a queued, running or waiting run.

    A run nobody executes (waiting, or queued/running with no live lease) is cancelled now and its
    parked approvals are withdrawn from the inbox. A run a worker holds is flagged
    (`cancel_requested`) and its worker told (`stops.announce`, on commit): a model turn in flight
    ends within a second keeping its text so far, a tool call in flight finishes (it is never
    torn in half) and the run ends before the next one. A second stop of a run already flagged
    tells the worker again and changes nothing else; a second cancel is refused.
    """
    with transaction.atomic():
        concurrency.lock_key_of(run_id)  # its key's row before its own (concurrency.py)
        run = Run.objects.select_for_update().get(id=run_id)
        if run.is_terminal:
            raise ActionRefused(f"run is already {run.status}")
        data = {"by": who, "reason": reason, "status": run.status}
        requested = (EventType.RUN_CANCEL_REQUESTED, {**data, "stop": True} if stop else data)
        lease_live = run.lease_expires_at is not None and run.lease_expires_at > timezone.now()
        if run.status != RunStatus.WAITING and lease_live:
            if run.cancel_requested and not stop:
                raise ActionRefused(
                    "cancel was already requested; the worker stops at the next step"
                )
            if not run.cancel_requested:
                flag = RunChange({"cancel_requested": True}, [requested])
                apply(run.id, flag)
                flag.apply_to(run)
            stops.announce(run.id)
            return run
        _end_idle_run(run, who=who, reason=reason, requested=requested)
    return run


def requested_stop_reason(run_id: uuid.UUID | str) -> str:
    """How the run's pending cancel was asked for: "stopped" (a stop) or "cancelled"."""
    last = (
        RunEvent.objects.filter(run_id=run_id, type=EventType.RUN_CANCEL_REQUESTED)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return STOPPED if isinstance(last, dict) and last.get("stop") else CANCELLED


def withdraw_unrun_work(
    run: Run, now: datetime, *, who: str | None, verb: str = CANCELLED
) -> list[EventSpec]:
    """What both ways of cancelling do: the run's pending inbox items are withdrawn (the reason
    in words: "the run was stopped by approver") and its steps nobody will run (planned, or
    waiting for a decision) skipped. Returns the events."""
    withdrawn = inbox().withdraw(run, reason=f"the run was {verb}{f' by {who}' if who else ''}")
    writer.skip_unrun_steps(run, now)
    return [
        (EventType.APPROVAL_WITHDRAWN, {"approval": a, "by": who, "reason": "run cancelled"})
        for a in withdrawn
    ]


def _end_idle_run(run: Run, *, who: str | None, reason: str, requested: EventSpec) -> RunChange:
    """Cancel a run nobody executes (waiting, or whose worker died), inside the caller's
    transaction with the run row locked: its parked approvals leave the inbox, steps nobody will
    run are skipped, and a step a dead worker left running keeps its history (its open attempt
    is closed as crashed; a side effect's outcome stays "unknown")."""
    now = timezone.now()
    stopped = bool(requested[1].get("stop"))
    verb = STOPPED if stopped else CANCELLED
    withdrawn = withdraw_unrun_work(run, now, who=who, verb=verb)
    for step in Step.objects.filter(run=run, status=StepStatus.RUNNING):
        writer.close_open_attempts(
            step,
            outcome=AttemptOutcome.CRASHED,
            error="run cancelled after the worker died",
            now=now,
        )
        step.status = (
            StepStatus.UNKNOWN
            if run.tool_policy(step.tool).get("side_effect")
            else StepStatus.SKIPPED
        )
        step.finished_at = now
        writer.save_step(step, ["status", "finished_at"])
    executions.run_ended(run, "the run was cancelled after its worker died during the call")
    change = cancelled(reason or f"{verb} by {who or 'system'}", stop_reason=verb)
    change = change.after(requested, *withdrawn)
    apply(run.id, change)
    change.apply_to(run)
    tracing.run_ended_on_commit(run.id)  # nobody executes it: its root span goes out here
    return change
