"""Waits made by tool code, as the runtime keeps them (`registry.wait_for_event`,
`wait_for_message`, the sleeps).

A wait is a `Wait` row named after the call's step (`TOOL_WAIT` + step id), found again by its
order within the call: the call runs again from its start once the run resumes, and its n-th
wait returns what the n-th wait was resolved with (a failed one raises again). A new wait:

- a timer already due returns at once (its wait recorded, resolved); one due within a
  sweeper's look (a second) is slept here, its wait recorded, so a crash mid-sleep finds it
  again;
- an event (or a thread's next message: its token is `message:<thread id>`) whose token another
  live run holds fails at once (`TokenHeld`, recorded); a pending wait of a run that has ended
  holds nothing (it is failed on the way);
- otherwise the run parks: the call's open attempt is not an attempt (it is undone, as an
  outage's is), its step pending again, its operation key let go, and the wait row, the step and
  the run's `waiting` status are one commit. A hook, a message posted to the thread
  (`waits/replies.py`) or the timer resolves the row and queues the run
  (`transitions.resume_parked`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from pydantic import JsonValue

from agentruns.models import Step, StepStatus, Thread, Wait, WaitKind, WaitStatus
from agentruns.models.journal import TOOL_WAIT
from agentruns.models.runs import TERMINAL_RUN_STATUSES
from agentruns.registry import get_tool
from agentruns.registry.context import current_step
from agentruns.registry.waits import events
from agentruns.registry.waits.events import EventTimedOut, EventWaitFailed, TokenHeld
from agentruns.registry.waits.messages import NotAConversation, message_token
from agentruns.runtime import writer
from agentruns.runtime.engine import journal
from agentruns.runtime.engine import slice as slices
from agentruns.runtime.engine.journal import Cancelled, Yielded
from agentruns.runtime.engine.lanes import blocking
from agentruns.runtime.engine.plan import stage
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.values.timestamps import iso

# how often the sweepers look for waits coming due (waits/due.py): a timer due sooner than
# this is slept on the run's thread instead (a look made just before it began would miss it)
LOOK_SECONDS = 1.0
# how the failure of a wait is told apart on replay (`resolved_by`)
TIMED_OUT, HELD, RUN_ENDED = "timeout", "held", "run ended"
# waits on a token the code names (one live run holds it at a time), not a random one
TOKENS_CHOSEN = (WaitKind.EVENT, WaitKind.MESSAGE)


class RuntimeToolWaits:
    """What `registry.waits` calls (installed at start-up, `install`)."""

    def event(self, token: str, timeout: timedelta | None) -> JsonValue:
        due = timezone.now() + timeout if timeout is not None else None
        return _wait(WaitKind.EVENT, token, due)

    def timer(self, due: datetime) -> JsonValue:
        return _wait(WaitKind.TIMER, "", due)

    def message(self, question: str | None, timeout: timedelta | None) -> JsonValue:
        """The run's thread's next message (`registry/waits/messages.py`)."""
        state = slices.current_or_none()
        if state is None:
            raise RuntimeError("a run's waits are made by a tool while it runs in a run")
        thread_id = state.run.thread_id
        if thread_id is None:
            raise NotAConversation(
                "this run is no conversation's turn: no customer message can reach it "
                "(ask_human asks a colleague)"
            )
        chat = blocking(state.lane, lambda: Thread.objects.filter(id=thread_id, chat=True).exists())
        if chat:
            raise NotAConversation(
                "in a chat the customer's reply is the chat's next message: ask your question "
                "in your answer and end your turn; their reply comes with this conversation"
            )
        due = timezone.now() + timeout if timeout is not None else None
        asked = {"question": question} if question else None
        return _wait(WaitKind.MESSAGE, message_token(thread_id), due, asked=asked)


def install() -> None:
    events.install(RuntimeToolWaits())


def woke(due: datetime | None, now: datetime) -> dict[str, Any]:
    """A timer's payload."""
    return {"woke_at": iso(now), "due_at": iso(due)}


def _wait(kind: str, token: str, due: datetime | None, *, asked: Any = None) -> JsonValue:
    state = slices.current_or_none()
    try:
        tctx = current_step()
    except LookupError:
        tctx = None
    if state is None or tctx is None:
        raise RuntimeError("a run's waits are made by a tool while it runs in a run")
    step = tctx.step
    name = f"{TOOL_WAIT}{step.id}"
    nth, tctx.waits_seen = tctx.waits_seen, tctx.waits_seen + 1
    mine = [wait for wait in state.waits if wait.name == name]
    if nth < len(mine):
        return blocking(state.lane, _again, state, step, tctx, mine[nth], kind, token)
    return blocking(state.lane, _new, state, step, tctx, name, kind, token, due, asked)


def _again(
    state: SliceState, step: Step, tctx: Any, wait: Wait, kind: str, token: str
) -> JsonValue:
    if wait.kind != kind or (kind in TOKENS_CHOSEN and wait.token != token):
        raise RuntimeError(
            f"the call's wait #{tctx.waits_seen} was a {wait.kind} wait on {wait.token!r}, now it "
            f"is a {kind} wait on {token!r}: code around a wait must do the same on every run"
        )
    if wait.status == WaitStatus.RESOLVED:
        return wait.payload
    if wait.status == WaitStatus.FAILED:
        raise failure(wait)
    now = timezone.now()
    if kind == WaitKind.TIMER and wait.due_at is not None and wait.due_at <= now:
        return _wake_here(wait, now)
    raise _park(state, step, tctx, wait, new=False)


def _new(
    state: SliceState,
    step: Step,
    tctx: Any,
    name: str,
    kind: str,
    token: str,
    due: Any,
    asked: Any,
) -> JsonValue:
    if (ending := journal.due(state, model=False, begun=True)) is not None:
        raise SliceEnds(after=ending)  # made once the call unwound (its transaction closed)
    now = timezone.now()
    wait = state.new_wait(name, kind, token=token, due_at=due, asked=asked)
    if kind == WaitKind.TIMER and due <= now:
        # nothing to wait for, but recorded all the same: the call's later waits are found again
        # by their order, and this one, replayed after `due`, must not take a later one's place
        wait.status, wait.payload = WaitStatus.RESOLVED, woke(due, now)
        wait.resolved_by, wait.resolved_at = "timer", now
        _record(state, wait)
        return wait.payload
    if kind in TOKENS_CHOSEN and (holder := holder_of(token, state.run.id)) is not None:
        _held(wait, holder)
        _record(state, wait)
        raise failure(wait)
    if kind == WaitKind.TIMER and (due - now).total_seconds() <= LOOK_SECONDS:
        _record(state, wait)  # short: slept here (a crash mid-sleep finds it again)
        if not journal.sleep_until(state, due):
            raise SliceEnds(after=Cancelled())
        return _wake_here(wait, timezone.now())
    raise _park(state, step, tctx, wait, new=True)


def _record(state: SliceState, wait: Wait) -> None:
    with transaction.atomic():
        writer.save_wait(wait)
        journal.commit(state, [])


def _wake_here(wait: Wait, now: datetime) -> JsonValue:
    """A timer past due, resolved by its own run (compare-and-set: a claimer may be at it)."""
    with transaction.atomic():
        current = Wait.objects.select_for_update().get(id=wait.id)
        if current.status == WaitStatus.PENDING:
            current.status, current.payload = WaitStatus.RESOLVED, woke(current.due_at, now)
            current.resolved_by, current.resolved_at = "timer", now
            writer.save_wait(current, ["status", "payload", "resolved_by", "resolved_at"])
    wait.status, wait.payload = current.status, current.payload
    if current.status == WaitStatus.FAILED:
        raise failure(current)
    return current.payload


def holder_of(token: str, run_id: Any) -> str | None:
    """The live run (other than `run_id`) waiting on `token`; a pending wait of a run that
    ended holds nothing and is failed here."""
    for wait in Wait.objects.filter(token=token, status=WaitStatus.PENDING).select_related("run"):
        if wait.run_id == run_id:
            continue
        if wait.run.status not in TERMINAL_RUN_STATUSES:
            return str(wait.run_id)
        with transaction.atomic():
            stale = Wait.objects.select_for_update().filter(id=wait.id, status=WaitStatus.PENDING)
            for row in stale:
                row.status, row.error = WaitStatus.FAILED, f"its run ended ({wait.run.status})"
                row.resolved_by, row.resolved_at = RUN_ENDED, timezone.now()
                writer.save_wait(row, ["status", "error", "resolved_by", "resolved_at"])
    return None


def _held(wait: Wait, holder: str) -> None:
    wait.status, wait.payload = WaitStatus.FAILED, {"held_by": holder}
    wait.error = f"run {holder} already waits on the token {wait.token!r}"
    wait.resolved_by, wait.resolved_at = HELD, timezone.now()


def failure(wait: Wait) -> EventWaitFailed:
    """The error a failed wait raises in its tool (again on every replay)."""
    if wait.resolved_by == TIMED_OUT:
        return EventTimedOut(wait.error or "no event arrived in time")
    if wait.resolved_by == HELD and isinstance(wait.payload, dict):
        return TokenHeld(wait.error, str(wait.payload.get("held_by", "")))
    return EventWaitFailed(wait.error or "the wait failed")


def _park(state: SliceState, step: Step, tctx: Any, wait: Wait, *, new: bool) -> SliceEnds:
    """The run waits: made once the call unwound (a transactional tool's transaction closed),
    by the tool's unit (`ToolWaitParks.end`)."""
    return SliceEnds(after=ToolWaitParks(step, tctx.attempt, wait, new))


@dataclass(frozen=True)
class ToolWaitParks:
    """A wait inside a tool's call parks the run: the call gives back what it holds (its
    attempt, its key), and the wait row and the run's `waiting` are one commit. A token another
    run took meanwhile: the wait is recorded failed (`TokenHeld`) and the run goes on at once."""

    step: Step
    attempt: int
    wait: Wait
    new: bool

    def end(self, state: SliceState) -> str:
        step, wait = self.step, self.wait
        with transaction.atomic():
            _give_back(state, step, self.attempt)
            if self.new:
                try:
                    with transaction.atomic():
                        writer.save_wait(wait)
                except IntegrityError as exc:
                    if "wait_unique_pending_token" not in str(exc):
                        # the run's n-th wait is journaled already: another slice of this run
                        # went on (this one's lease lapsed and was taken over)
                        raise LeaseLost(str(state.run.id)) from None
                    _held(wait, holder_of(wait.token, state.run.id) or "unknown")
                    writer.save_wait(wait)
                    return journal.end(state, Yielded("the token is held by another run"))
            parked = journal.park(state)
            if self.new and wait.kind == WaitKind.MESSAGE:
                _announce_question(state, wait)
            return parked


def _announce_question(state: SliceState, wait: Wait) -> None:
    """`thread.asked`, in the commit that parks the run (a resumed run finds its wait and does
    not ask again); its message id is the one the thread shows."""
    asked = wait.asked if isinstance(wait.asked, dict) else {}
    question = asked.get("question")
    inbox().agent_said(
        state.run.id,
        str(state.run.thread_id),
        asked=True,
        message_id=f"ask-{wait.id}",
        text=question if isinstance(question, str) else "",
        sent_at=wait.created_at or timezone.now(),
    )


def _give_back(state: SliceState, step: Step, attempt: int) -> None:
    """The call is not over, and not an attempt: it runs again, from its start, on resume."""
    if step.status == StepStatus.RUNNING and get_tool(step.tool).commits_before_call:
        writer.undo_attempt(step, attempt)
        step.status, step.attempts = StepStatus.PENDING, attempt - 1
        stage(state.pending.batch, step, ["status", "attempts"])
    if operations.holds_key(state.run, step.tool):
        executions.settle(step.id, executions.RELEASED)  # a parked call holds no key
