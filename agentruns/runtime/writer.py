"""The one writer of the engine room: every Step, StepAttempt and RunEvent row is written here.

Everything else above the store describes its change as data (unsaved rows in a `WriteBatch`,
a list of events, the fields of a `RunChange`) and hands it to one of these verbs; this module
is the only one that asks the store (`runtime/store/`) to write, or saves, updates, creates or
deletes those rows (`tests/runtime/test_one_writer.py` walks the code and holds every other
module to that). In the style of DBOS's `record_operation_result`: plain functions, each one
write of one kind.

- `commit`: the engine's write, fenced on its lease (LeaseLost when the lease moved); renews
  the lease, allocates the event seqs and reads the cancel flag in the same round trip;
- `append`: a writer that holds no lease (services, decisions, the sweeper, cancel), inside its
  transaction;
- `create_run`, `claim`, `claim_queued`, `commit_deltas`: a run's first row and events, a
  lease taken (one run, or the claimers' batch), the streamed text of a worker process's runs;
- step and attempt changes (`save_step`, `add_attempt`, `end_attempt`, `undo_attempt`,
  `skip_unrun_steps`, `close_open_attempts`, `copy_steps`): the engine's (recovery, a tool's
  attempts, a refusal, a park for approval) and those people and the inbox make, inside the
  caller's transaction, with the events that report them written by the same caller through
  `commit` or `append`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from agentruns.models import JournalEntry, Run, Step, StepAttempt, StepStatus, Wait
from agentruns.runtime.events import EventSpec
from agentruns.runtime.store import batch_claims, get_store
from agentruns.runtime.store.base import InFlightCap, RunDeltas
from agentruns.runtime.store.rows import WriteBatch

# the statuses of steps nobody will run once a run stops (planned, or waiting for a decision)
UNRUN = (StepStatus.PENDING, StepStatus.WAITING_APPROVAL)


# ------------------------------------------------------------------ through the store
def commit(
    run_id: uuid.UUID,
    owner: str,
    events: list[EventSpec],
    *,
    now: datetime,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
    batch: WriteBatch | None = None,
    end_transaction: bool = False,
) -> tuple[int, bool]:
    """The engine's fenced commit: the run update, `events` and the rows of `batch`, atomically.
    Returns (last seq, cancel requested); LeaseLost (nothing written) when `owner` lost it."""
    return get_store().commit(
        run_id,
        owner,
        events,
        now=now,
        set_fields=set_fields,
        incr_fields=incr_fields,
        batch=batch,
        end_transaction=end_transaction,
    )


def append(
    run_id: uuid.UUID | str,
    events: list[EventSpec],
    *,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
) -> int:
    """`events` (and run fields) for a writer that holds no lease, inside its transaction;
    viewers are nudged on commit. Returns the last seq."""
    return get_store().append(run_id, events, set_fields=set_fields, incr_fields=incr_fields)


def create_run(
    run: Run,
    events: list[EventSpec],
    *,
    owner: str | None,
    now: datetime,
    notify: str | None,
    in_flight: InFlightCap | None = None,
) -> int:
    """The new run row with its first events (already leased by `owner` when given; checked
    against the starter's in-flight cap in the same statement: InFlightCapReached)."""
    return get_store().create_run(
        run, events, owner=owner, now=now, notify=notify, in_flight=in_flight
    )


def claim(
    run_id: uuid.UUID, owner: str, events: list[EventSpec], *, lease: dict[str, Any], now: datetime
) -> bool:
    """Take the run's lease if it is free (a queued run starts with `events`)."""
    return get_store().claim(run_id, owner, events, lease=lease, now=now)


def claim_queued(
    limit: int, events: list[EventSpec], *, tag: str, lease_expires_at: datetime, now: datetime
) -> list[Run]:
    """The claimers' batch: up to `limit` queued runs leased to `tag` and started with `events`
    (`dispatch/claims.py`)."""
    return batch_claims.claim_queued(
        limit, events, tag=tag, lease_expires_at=lease_expires_at, now=now
    )


def commit_deltas(deltas: list[RunDeltas], *, now: datetime) -> dict[uuid.UUID, tuple[int, bool]]:
    """The streamed text of many runs, each fenced on its lease, in one transaction."""
    return get_store().commit_deltas(deltas, now=now)


# ------------------------------------------------------------------ steps and attempts
def save_step(step: Step, fields: Sequence[str] | None = None) -> None:
    """A step changed by the engine, a service or a decision (inside the caller's transaction)."""
    if fields is None:
        step.save()
    else:
        step.save(update_fields=list(fields))


def skip_unrun_steps(run: Run | uuid.UUID, now: datetime, *, after: int | None = None) -> int:
    """Steps nobody will run once the run stops (`after`: only those after that index). A step
    whose outcome is unknown is not among them: skipping it would say it did not happen."""
    steps = Step.objects.filter(run=run, status__in=UNRUN)
    if after is not None:
        steps = steps.filter(index__gt=after)
    return steps.update(status=StepStatus.SKIPPED, finished_at=now, next_attempt_at=None)


def add_attempt(step: Step, number: int, **fields: Any) -> StepAttempt:
    """An attempt recorded once it ended (a call that committed nothing before it ran)."""
    return StepAttempt.objects.create(step=step, number=number, **fields)


def end_attempt(step: Step, number: int, *, open_only: bool = False, **fields: Any) -> int:
    """Attempt `number` of `step` ends with `fields` (`open_only`: unless it already ended)."""
    attempts = StepAttempt.objects.filter(step=step, number=number)
    if open_only:
        attempts = attempts.filter(finished_at__isnull=True)
    return attempts.update(**fields)


def undo_attempt(step: Step, number: int) -> int:
    """Attempt `number` never reached anything (its server was down): it is not an attempt."""
    deleted, _ = StepAttempt.objects.filter(step=step, number=number).delete()
    return deleted


def close_open_attempts(step: Step, *, outcome: str, error: str, now: datetime) -> int:
    """The attempts of `step` nobody finished (its worker died) end with `outcome`."""
    return StepAttempt.objects.filter(step=step, finished_at__isnull=True).update(
        finished_at=now, outcome=outcome, error=error
    )


def copy_steps(steps: Iterable[Step]) -> list[Step]:
    """New step rows (a fork's history), in one statement."""
    return Step.objects.bulk_create(list(steps))


# ------------------------------------------------------------------ the journal's other rows
def save_journal(entries: Sequence[JournalEntry]) -> None:
    """The journal entries of units other than steps (in the engine commit's transaction)."""
    JournalEntry.objects.bulk_create(list(entries))


def save_waits(waits: Sequence[Wait], fields: Sequence[str]) -> None:
    """Changed waits, in one statement (the timers a sweeper fires at once)."""
    Wait.objects.bulk_update(list(waits), list(fields))


def save_wait(wait: Wait, fields: Sequence[str] | None = None) -> None:
    """A wait of the run's loop, new or changed (in the caller's transaction)."""
    if fields is None:
        wait.save()
    else:
        wait.save(update_fields=list(fields))
