"""A model that streams, inside the model unit (`unit.py`): its attempt's text committed as it
comes (the first delta its own commit, later ones through the process's delta writer)."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone
from pydantic_ai.models import Model

from agentruns.conf import conf
from agentruns.models import Step, StepStatus
from agentruns.runtime.dispatch import connections, stops
from agentruns.runtime.engine.model.request import _classified
from agentruns.runtime.engine.plan import (
    Answer,
    begin_attempt,
    cut_turn,
)
from agentruns.runtime.engine.slice import SliceState
from agentruns.runtime.events import EventType, step_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.execution.delta_writer import DeltaFeed, delta_writer
from agentruns.runtime.providers import TextSink
from agentruns.runtime.providers.models import waits
from agentruns.runtime.providers.stream_pump import (
    SinkFailed,
    run_streaming,
)
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.text import storable_text

# the first text of a turn is shown at once when the model took this long to say anything
FIRST_DELTA_AFTER_S = 0.005


def _attempt_is_new(step: Step, attempt: int) -> bool:
    """No row of this attempt was written yet (nothing streamed by it)."""
    return step._state.adding or step.attempts < attempt


def _streamed(state: SliceState, step: Step, attempt: int, model: Model, body: Any) -> Answer:
    """A model that streams: the body runs on the process's stream loop while this thread
    commits the attempt's text as it comes (the first delta its own commit, later ones through
    the process's delta writer in a worker, batched commits of its own in-process)."""
    started = timezone.now()
    executor = state.executor
    text: list[str] = []
    pending = ""  # the text no delta event carries yet
    feed: DeltaFeed | None = None
    sink = TextSink()
    flushed = False
    last_flush = time.monotonic()
    flush_s = conf.DELTA_FLUSH_MS / 1000.0
    if waits(model):
        connections.release()  # a model that keeps us waiting: no connection held
    deltas = run_streaming(body, sink)
    done = False
    try:
        while True:
            piece = storable_text(next(deltas))
            text.append(piece)
            pending += piece
            since = time.monotonic() - last_flush
            if (
                len(pending) >= conf.DELTA_FLUSH_CHARS
                or since >= flush_s
                or (not flushed and since >= FIRST_DELTA_AFTER_S)
            ):
                _flush_delta(state, step, attempt, pending, started)
                pending, last_flush, flushed = "", time.monotonic(), True
                if executor.cancel_requested:  # read by that commit: the stop's second way in
                    stops.deliver(state.run.id)
                failpoints.hit("model_streaming", tool=state.run.agent, step_id=step.id)
                if waits(model):
                    connections.release()
                if state.drain is not None and feed is None:  # a worker: deltas go together
                    feed = delta_writer().open(
                        state.run.id,
                        executor.owner,
                        step.index,
                        attempt,
                        lambda cancel: _feed_committed(executor, cancel),
                    )
                    sink.take = _taker(executor, feed, text)
    except StopIteration as end:
        payload, done = end.value, True
    except SinkFailed as failed:
        raise failed.error from None  # the engine's own error (a lost lease), not the model's
    except stops.TurnStopped:
        done = True  # the text so far stands: the writer's unwritten rest goes in our commit
        tail = pending + (feed.close() if feed is not None else "")
        raise cut_turn(attempt, started, "".join(text), tail) from None
    except Exception as exc:
        raise _classified(model, exc) from exc
    finally:
        deltas.close()  # a stream left early: its task is cancelled
        if feed is not None and not done:  # failed: its text is superseded, its error stands
            feed.close(raise_failure=False)
    if feed is not None:  # before our own commit: the text the writer has not written yet
        pending += feed.close()
    return Answer(payload, attempt, started, "".join(text), pending)


def _taker(executor: Any, feed: DeltaFeed, text: list[str]) -> Any:
    """`sink.take` once the feed is open: called inside the stream's task (no database)."""

    def take(delta: str) -> None:
        text.append(piece := storable_text(delta))
        feed.add(piece)
        executor.check_lease()

    return take


def _feed_committed(executor: Any, cancel_requested: bool) -> None:
    executor.cancel_requested = executor.cancel_requested or cancel_requested
    if cancel_requested:  # the flush read a cancel: the turn in flight stops now
        stops.deliver(executor.run_id)
    if executor.heartbeat is not None:
        executor.heartbeat.renewed()


def _flush_delta(state: SliceState, step: Step, attempt: int, text: str, started: Any) -> None:
    """One commit: the streamed text (and, on the attempt's first flush, the step as running
    with its attempt row), with what the slice has not committed yet."""
    events = []
    batch = None
    if _attempt_is_new(step, attempt):
        batch = WriteBatch()
        step.status = StepStatus.RUNNING
        begin_attempt(batch, step, attempt, state.executor.owner, started)
        events.append((EventType.STEP_STARTED, step_event_data(step, error="")))
    events.append((EventType.MODEL_DELTA, {"step": step.index, "attempt": attempt, "text": text}))
    state.executor.commit(events, batch=batch)
    state.executor.check_lease()
