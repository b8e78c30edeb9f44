"""One slice of one run, declared: the fence its commits are conditional on, what the executor
loads when it takes the lease, what the units of the agent's loop read and change.

`SliceState` is a plain dataclass the unit functions (`model/unit.py`, `tools/`, `waits.py`,
`journal.py`) work on; `current()` is the slice of the agent run in progress (a context
variable: the units are called from deep inside `agent.run`).

A slice ends when the journal made its last commit (`journal.end`) and the unit raises
`SliceEnds` (a BaseException, so no `except Exception` inside the agent's loop can swallow it),
which only unwinds `agent.run`. A unit's blocking (database) work runs on the slice's `lane`
(`lanes.py`), never on the event loop.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from agentruns.models import Run, Step, StepKind, Wait
from agentruns.registry import Agent
from agentruns.runtime.engine.lanes import Lane
from agentruns.runtime.events import EventSpec
from agentruns.runtime.store.rows import WriteBatch


class SliceEnds(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """The slice stopped here, its last commit made (`journal.end`): it unwinds the agent's loop
    (no `except Exception` inside it can swallow it) and `outcome` is what the executor
    returns. `after`: an end raised from inside a tool's call, made by the tool's unit once the
    call unwound (a transactional tool's transaction closed first)."""

    def __init__(self, outcome: str = "", *, after: Any = None) -> None:
        super().__init__(outcome)
        self.outcome, self.after = outcome, after


@dataclass(slots=True, eq=False)
class Pending:
    """What the slice has done but not committed yet: the rows, events and run fields that ride
    with the next commit (the model step, its plan, the read-only calls after it)."""

    batch: WriteBatch = field(default_factory=WriteBatch)
    events: list[EventSpec] = field(default_factory=list)
    set_fields: dict[str, Any] = field(default_factory=dict)
    incr_fields: dict[str, Any] = field(default_factory=dict)
    # journal entries of other units (JournalEntry rows, written in the same transaction)
    journal: list[Any] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.events
            or self.batch.inserts
            or self.batch.updates
            or self.set_fields
            or self.journal
        )

    def take(self) -> Pending:
        taken = Pending(self.batch, self.events, self.set_fields, self.incr_fields, self.journal)
        self.batch, self.events, self.set_fields, self.incr_fields = WriteBatch(), [], {}, {}
        self.journal = []
        return taken


@dataclass(slots=True, eq=False)
class SliceState:
    # the fence: the run whose lease this slice holds, and who holds it (every commit is fenced
    # on it: journal.py)
    run_id: uuid.UUID
    owner: str
    ttl: float
    # where the slice's blocking work runs (lanes.py)
    lane: Lane
    # set by the pool the slice runs in (None: executed in-process, nobody drains it)
    drain: threading.Event | None = None
    # the process's lease keeper's entry for this run (dispatch/lease.py), once claimed
    heartbeat: Any = None
    # read by the last commit: a cancel waits at the next boundary
    cancel_requested: bool = False
    # (agent, concurrency key) and the run's thread, once read: an end lets them go
    run_key: tuple[str, str | None] | None = None
    thread_id: str | None = None
    # tracing.begin_slice: the slice's span, None when tracing is off
    trace_slice: Any = None
    # the run and its journal, once loaded
    run: Run = None  # type: ignore[assignment]
    agent: Agent = None  # type: ignore[assignment]
    steps: list[Step] = field(default_factory=list)
    # when the slice gives its slot back (time.monotonic; AGENTRUNS_SLICE_SECONDS): never unless set
    ends_at: float = math.inf
    pending: Pending = field(default_factory=Pending)
    # the n-th model request of the agent's loop is model_steps[n] (index order)
    model_steps: list[Step] = field(default_factory=list)
    models_seen: int = 0
    # whether the run's latest backing-off event was read for the rate-limit slot it held
    slot_checked: bool = False
    # (index of the model step, tool call id) -> the tool step it planned
    calls: dict[tuple[int, str], Step] = field(default_factory=dict)
    # tool call id -> its latest tool step (what the scripted model reads of a call)
    by_call: dict[str, Step] = field(default_factory=dict)
    # side-effect steps whose "running + attempt" went out with their model's commit
    begun_here: set[uuid.UUID] = field(default_factory=set)
    # the journal entries of other units, and the waits, in the order they were recorded
    entries: list[Any] = field(default_factory=list)
    entries_seen: int = 0
    waits: list[Any] = field(default_factory=list)
    waits_seen: int = 0
    # where a resumed slice starts (resume.py): the point this slice loaded, the loop just
    # before its latest model request, whether the run is a thread's turn (its answer goes to the
    # thread), and whether this slice stored a point
    resume: Any = None
    request_mark: Any = None
    thread_turn: bool = False
    resume_stored: bool = False
    # what each terminal tool step says to the scripted model, by (step id, status, attempts)
    step_contents: dict[tuple[Any, str, int], str] = field(default_factory=dict)

    def index_steps(self) -> None:
        """`model_steps` and `calls` from `steps` (loaded in index order)."""
        model: Step | None = None
        for step in self.steps:
            if step.kind == StepKind.MODEL:
                model = step
                self.model_steps.append(step)
            elif model is not None and step.call_id:
                self.calls[(model.index, step.call_id)] = step
                self.by_call[step.call_id] = step

    @property
    def current_model(self) -> Step | None:
        """The model step whose tool calls the loop is processing now."""
        return self.model_steps[self.models_seen - 1] if self.models_seen else None

    def step_for_call(self, call_id: str) -> Step | None:
        model = self.current_model
        return None if model is None else self.calls.get((model.index, call_id))

    def awaited_approval(self, call_id: str) -> bool:
        """The call was put before the inbox in an earlier slice (an approval wait names it)."""
        return any(call_id in (wait.calls or ()) for wait in self.waits)

    def add_step(self, step: Step) -> None:
        self.steps.append(step)
        if step.kind == StepKind.MODEL:
            self.model_steps.append(step)
        elif (model := self.current_model) is not None and step.call_id:
            self.calls[(model.index, step.call_id)] = step
            self.by_call[step.call_id] = step

    def new_wait(self, name: str, kind: str, *, token: str = "", **fields: Any) -> Wait:
        """The run's next wait (not saved), with its token (a random one unless the caller's)."""
        wait = Wait(
            run_id=self.run.id,
            ordinal=len(self.waits),
            name=name[:200],
            kind=kind,
            token=token or secrets.token_urlsafe(32),
            **fields,
        )
        self.waits.append(wait)
        return wait

    def now(self) -> Any:
        return timezone.now()

    def slice_over(self) -> bool:
        return time.monotonic() >= self.ends_at or (self.drain is not None and self.drain.is_set())


_current: ContextVar[SliceState | None] = ContextVar("agentruns_slice", default=None)


def current() -> SliceState:
    state = _current.get()
    if state is None:
        raise RuntimeError("no run slice in progress (a durable unit outside a run)")
    return state


def current_or_none() -> SliceState | None:
    return _current.get()


@contextmanager
def running(state: SliceState) -> Iterator[SliceState]:
    token = _current.set(state)
    try:
        yield state
    finally:
        _current.reset(token)


def current_lane() -> Lane | None:
    """The lane of the slice in progress (None outside a run)."""
    state = _current.get()
    return state.lane if state is not None else None
