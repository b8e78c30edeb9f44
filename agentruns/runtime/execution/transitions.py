"""Every change of `Run.status`, in one place: the fields it sets and the events it appends.

The executor applies a `RunChange` through its fenced commit (it holds the lease); services,
decisions and the sweeper apply theirs through `apply` (unfenced, inside their transaction).
Either way the fields and the `run.status` event are the ones written here, so a run's
timeline reads the same whoever moved it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus, Wait, WaitKind, WaitStatus
from agentruns.runtime import outcomes, tracing, writer
from agentruns.runtime.conversations import transcript
from agentruns.runtime.dispatch import concurrency, thread_line
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.inbox import inbox
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.values.redaction import redact_text
from agentruns.runtime.values.timestamps import iso


class ActionRefused(Exception):
    """The action does not apply to the run in its current state (a 409 for the API)."""


# a run nobody executes holds no lease
RELEASED: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None}


@dataclass
class RunChange:
    fields: dict[str, Any]
    events: list[EventSpec] = field(default_factory=list)

    def then(self, *events: EventSpec) -> RunChange:
        return RunChange(self.fields, [*self.events, *events])

    def after(self, *events: EventSpec) -> RunChange:
        return RunChange(self.fields, [*events, *self.events])

    def apply_to(self, run: Run) -> None:
        """Mirror the change on an instance the caller keeps using."""
        for name, value in self.fields.items():
            setattr(run, name, value)


def _status_event(status: str, **data: Any) -> EventSpec:
    return (EventType.RUN_STATUS, {"status": status, **data})


# ------------------------------------------------------------------ the changes
def started() -> RunChange:
    """queued -> running (the executor's claim adds its lease)."""
    return RunChange({"status": RunStatus.RUNNING}, [_status_event(RunStatus.RUNNING)])


def finished(
    status: str,
    *,
    output: str = "",
    output_data: Any = None,
    error: str = "",
    stop_reason: str = "",
) -> RunChange:
    """-> succeeded / failed / cancelled: the run ends, with its reason (and its output: text,
    or a structured output's object as `output_data` with its JSON text as `output`)."""
    error = redact_text(error)  # from exceptions and step errors; only people read it
    events: list[EventSpec] = []
    if output_data is not None:
        events.append((EventType.RUN_OUTPUT, {"text": output, "data": output_data}))
    elif output:
        events.append((EventType.RUN_OUTPUT, {"text": output}))
    events.append(_status_event(status, error=error, stop_reason=stop_reason))
    fields = {
        "status": status,
        "output": output,
        "output_data": output_data,
        "error": error,
        "stop_reason": stop_reason,
        "finished_at": timezone.now(),
        "cancel_requested": False,
        **RELEASED,
    }
    return RunChange(fields, events)


def ended(run: Run, status: str, *, steps: list[Step] | None = None, **why: Any) -> RunChange:
    """`finished`, announced (its outcome and hand-overs set), for a writer that folds the end
    into a commit of its own: the final model answer's, which holds the run's `steps`."""
    change = finished(status, **why)
    announce(run.id, change, run=run, steps=steps)
    return change


def parked() -> RunChange:
    """running -> waiting: a step needs a human; the run holds no lease and no worker."""
    return RunChange({"status": RunStatus.WAITING, **RELEASED}, [_status_event(RunStatus.WAITING)])


def yielded(now: datetime, *, reason: str = "time slice") -> RunChange:
    """running -> queued: the run gives its worker back (time slice, the worker draining) and
    rings again."""
    return RunChange(
        {"status": RunStatus.QUEUED, "enqueued_at": now, **RELEASED},
        [_status_event(RunStatus.QUEUED, reason=reason)],
    )


def backing_off(
    until: datetime, *, reason: str = "retry backoff", waiting: str = "", **data: Any
) -> RunChange:
    """running -> queued until a retry is due: no lease, no thread; its doorbell rings at `until`
    (`enqueued_at` is that time, so the sweeper does not ring it earlier). `reason` says why
    (a model outage names its error, model_outage.py); `data` rides on the event. `waiting`: what
    the run waits for (its agent, after a deploy without it), kept in `error` until it runs again."""
    fields: dict[str, Any] = {"status": RunStatus.QUEUED, "enqueued_at": until, **RELEASED}
    event: dict[str, Any] = {"reason": redact_text(reason), "until": iso(until), **data}
    if waiting:
        fields["error"] = event["error"] = redact_text(waiting)
        event["reason"] = "waiting"
    return RunChange(fields, [_status_event(RunStatus.QUEUED, **event)])


def requeued(now: datetime) -> RunChange:
    """failed -> queued (retry, a resolved step): the run continues where it stopped."""
    return RunChange(
        {
            "status": RunStatus.QUEUED,
            "error": "",
            "stop_reason": "",
            "outcome": "",  # it is given again when the run ends again
            "finished_at": None,
            "cancel_requested": False,
            "enqueued_at": now,
            **RELEASED,
        },
        [_status_event(RunStatus.QUEUED)],
    )


def cancelled(error: str, *, stop_reason: str = "cancelled") -> RunChange:
    """-> cancelled; `stop_reason` "stopped" when its starter or an operator stopped it."""
    return finished(RunStatus.CANCELLED, error=error, stop_reason=stop_reason)


def aborted(error: str) -> RunChange:
    """waiting -> failed: staff aborted after an unknown outcome."""
    return finished(RunStatus.FAILED, error=error, stop_reason="aborted")


# ------------------------------------------------------------------ applying them
def announce(
    run_id: uuid.UUID | str,
    change: RunChange,
    *,
    run: Run | None = None,
    steps: list[Step] | None = None,
) -> None:
    """What the outside world hears of the change (a failing run's webhook), written in the
    transaction that writes the change: every writer of a RunChange calls this with it. A change
    that ends the run gets its outcome and opens its hand-overs here (runtime/outcomes.py)."""
    outcomes.ending(run_id, change, run=run, steps=steps)
    if change.fields.get("status") == RunStatus.FAILED:
        inbox().run_failed(run_id, change.fields)


def apply(run_id: uuid.UUID | str, change: RunChange) -> int:
    """Write `change` for a writer that holds no lease (inside its transaction); a run with a
    concurrency key lets it go when it ends and takes it again when it is queued again."""
    announce(run_id, change)
    last_seq = writer.append(run_id, change.events, set_fields=change.fields)
    concurrency.follow(run_id, change.fields.get("status"))
    thread_id = thread_line.follow_change(run_id, change.fields.get("status"))
    if thread_id is not None and change.fields.get("status") == RunStatus.CANCELLED:
        transcript.record_unanswered(run_id, thread_id)  # what it did, for the next turn
    return last_seq


# what a decision does to the run it parked (`resume_parked`'s `then`)
RESUME, WAIT, ABORT = "resume", "wait", "abort"


def resume_parked(
    run_id: uuid.UUID | str, events: list[EventSpec], *, then: str = RESUME, error: str = ""
) -> bool:
    """A decision on a parked run, inside the decider's transaction: the audit `events`, then
    `resume` (waiting -> queued, rung on commit; a cancelled or finished run only gets the
    events), `wait` (the run is left as it is: a partial approval) or `abort` (waiting ->
    failed with `error`: the decider holds the run's lock, saw it waiting and skipped the steps
    after this one). Returns whether the run moved."""
    moved = then == ABORT
    change = aborted(error).after(*events) if moved else RunChange({}, events)
    if then == RESUME and not _approvals_decided(run_id):
        then = WAIT  # another call of the same wait is still before a person: stay parked
    if then == RESUME:
        waiting = Run.objects.filter(id=run_id, status=RunStatus.WAITING)
        moved = bool(waiting.update(status=RunStatus.QUEUED, enqueued_at=timezone.now()))
        if moved:
            change = change.then(_status_event(RunStatus.QUEUED))
    apply(run_id, change)
    if moved and then == RESUME:  # a run that let its concurrency key go takes it again
        concurrency.follow(run_id, RunStatus.QUEUED)
    if then == RESUME:
        tracing.approvals_decided(run_id, change.events)
        if moved:
            # on commit: a worker must never pick the task up before the decision is visible,
            # and a rolled-back decision must not ring at all (the sweeper re-rings if lost)
            transaction.on_commit(lambda: enqueue(run_id))
    nudge_on_commit(uuid.UUID(str(run_id)), 0, inbox=True)
    return moved


# ------------------------------------------------------------------ waits by token
class WaitAlreadyResolved(ActionRefused):
    """A second resolution of a token: nothing changed; says who resolved it first, and when."""

    def __init__(self, wait: Wait) -> None:
        by = wait.resolved_by or "nobody"
        super().__init__(f"already {wait.status} by {by} at {iso(wait.resolved_at)}")
        self.wait = wait


class UnknownToken(LookupError):
    """Nobody waits on this token."""


def approval_results(steps: list[Step]) -> dict:
    """The `DeferredToolResults` (JSON) of an approval wait, from what the decisions did to its
    steps: an approved call runs with its step's arguments (an edit merged into the request),
    a rejected or expired one reaches the model as a denial with the reason."""
    approvals: dict[str, dict] = {}
    for step in steps:
        if step.status == StepStatus.REJECTED:
            approvals[step.call_id] = {"kind": "tool-denied", "message": step.error}
        else:
            approvals[step.call_id] = {"kind": "tool-approved", "override_args": step.arguments}
    return {"approvals": approvals, "calls": {}, "metadata": {}}


def _approvals_decided(run_id: uuid.UUID | str) -> bool:
    """No call of the run waits for a person any more: its approval wait, if any, is resolved
    with the decisions (`approval_results`), and the run may go on."""
    if Step.objects.filter(run_id=run_id, status=StepStatus.WAITING_APPROVAL).exists():
        return False
    for wait in Wait.objects.filter(
        run_id=run_id, kind=WaitKind.APPROVAL, status=WaitStatus.PENDING
    ):
        steps = list(Step.objects.filter(run_id=run_id, call_id__in=wait.calls))
        wait.status, wait.resolved_at, wait.resolved_by = (
            WaitStatus.RESOLVED,
            timezone.now(),
            "the inbox",
        )
        wait.payload = approval_results(steps)
        writer.save_wait(wait, ["status", "resolved_at", "resolved_by", "payload"])
    return True


def resolve_wait(token: str, payload: Any = None, *, by: str = "", error: str = "") -> Wait:
    """Resolve the wait on `token` with `payload` (or fail it with `error`): once, from any
    process; the run waiting on it is queued and rung on commit. WaitAlreadyResolved for a
    second resolution (nothing changes; the token's latest wait says who and when),
    UnknownToken when nobody waits on it. (A chosen token is waited on again once resolved:
    one pending wait per token, any number resolved.)"""
    with transaction.atomic():
        waits = Wait.objects.select_for_update().filter(token=token)
        wait = waits.filter(status=WaitStatus.PENDING).first()
        if wait is None:
            latest = waits.order_by(F("resolved_at").desc(nulls_last=True), "-id").first()
            if latest is None:
                raise UnknownToken(token)
            raise WaitAlreadyResolved(latest)
        settle_wait(wait, payload, by=by, error=error)
    return wait


def settle_wait(wait: Wait, payload: Any = None, *, by: str = "", error: str = "") -> None:
    """A pending wait the caller locked is resolved (or failed), and its run queued."""
    wait.status = WaitStatus.FAILED if error else WaitStatus.RESOLVED
    wait.payload, wait.error = (None, error) if error else (payload, "")
    wait.resolved_by, wait.resolved_at = (by or "system")[:150], timezone.now()
    writer.save_wait(wait, ["status", "payload", "error", "resolved_by", "resolved_at"])
    resume_parked(wait.run_id, [])


def resume_waiting(run_ids: list[Any], now: datetime) -> list[Any]:
    """Waits of these runs were resolved in the caller's transaction (timers that came due, by
    the batch): those still waiting are queued, each with its status event, and rung once
    (`concurrency.ring`: one NOTIFY the claimers hear, or a doorbell each). Returns their ids."""
    rows = list(
        Run.objects.select_for_update()
        .filter(id__in=set(run_ids), status=RunStatus.WAITING)
        .values_list("id", "agent", "concurrency_key")
    )
    for run_id, agent, concurrency_key in rows:
        change = RunChange(
            {"status": RunStatus.QUEUED, "enqueued_at": now}, [_status_event(RunStatus.QUEUED)]
        )
        announce(run_id, change)
        writer.append(run_id, change.events, set_fields=change.fields)
        concurrency.follow(run_id, RunStatus.QUEUED, key=(agent, concurrency_key))
        nudge_on_commit(run_id)
    if rows:
        concurrency.ring([run_id for run_id, _, _ in rows])
    return [run_id for run_id, _, _ in rows]
