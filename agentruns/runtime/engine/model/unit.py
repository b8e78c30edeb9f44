"""The model request unit: the n-th model request of the agent's loop is the run's n-th model
step (DESIGN.md 4.4, 4.10, 4.11).

Replayed: a step that succeeded returns what it recorded (its `payload`, the ModelResponse; a
step of the engine before this one: rebuilt from its text and calls). Executed: the slice's
boundary is checked (`journal.check`), then attempts as the engine always made them: a
failure before any text is an outage the run waits out (no attempt counted), an attempt that
streamed text is an attempt and its text is superseded. The request itself (`request_model`, the
unit's body) runs in the run's own task: a model that streams hands each text delta to the
unit's `StreamedText` (`deliver_delta`), whose first flush is the step's own commit (the step
running, its attempt row, the text) and whose later text goes to the process's delta writer; one
that does not stream is asked whole, its text one delta in the step's commit. The step's result
and the tool calls it asked for (planned as rows: `plan.py`) wait in the slice's pending batch
for its next commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.utils import timezone
from pydantic_ai.durable_exec import record_durable_unit
from pydantic_ai.messages import (
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import Model

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, Step, StepKind, StepStatus
from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime import tracing
from agentruns.runtime.conversations.transcript import recorded
from agentruns.runtime.dispatch import stops
from agentruns.runtime.engine import journal, resume
from agentruns.runtime.engine.journal import BackingOff, Cancelled, Failed
from agentruns.runtime.engine.model import slot as model_slot
from agentruns.runtime.engine.plan import (
    Answer,
    TurnCut,
    begin_attempt,
    crashed,
    cut_turn,
    end_attempt,
    new_step,
    record_cut_turn,
    record_model_step,
    stage,
)
from agentruns.runtime.engine.pydantic_ai_private import (
    consume_event_stream,
    open_durable_unit_stream,
)
from agentruns.runtime.engine.slice import SliceEnds, SliceState, current_or_none
from agentruns.runtime.engine.waits import record_answered_elsewhere
from agentruns.runtime.events import EventType, step_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.execution.delta_writer import DeltaFeed, delta_writer
from agentruns.runtime.outages import process_health
from agentruns.runtime.outages.model_outage import ModelOutage
from agentruns.runtime.providers import ModelError, openai_compatible
from agentruns.runtime.providers.model_errors import model_error
from agentruns.runtime.providers.model_fallback import FallingBack, fallback_left, fallback_models
from agentruns.runtime.providers.models import estimated_usage, model_for, name_of, streams
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.redaction import redact_text
from agentruns.runtime.values.text import storable_text


# ------------------------------------------------------------------ the unit
async def execute(state: SliceState, model_id: str | None, body: Any, params: Any) -> Any:
    position = state.models_seen
    if position >= len(state.model_steps):  # a new request: its calls' answers came back
        record_answered_elsewhere(state, params.messages)
    resume.mark_request(state, position, params)
    state.models_seen += 1
    step = state.model_steps[position] if position < len(state.model_steps) else None
    if step is not None and step.status == StepStatus.SUCCEEDED:
        record_durable_unit(executed=False)
        return recorded(step)
    await journal.check(state, model=step is None or step.status != StepStatus.RUNNING)
    if step is None:
        step = new_step(state, StepKind.MODEL, status=StepStatus.RUNNING)
        state.add_step(step)
    elif step.status == StepStatus.RUNNING:  # left running by a dead worker: a new attempt
        await state.lane.run(_superseded, state, step)  # (rare; tracing may read)
    model = _model(state, model_id)
    if state.pending and not streams(model):
        # what the slice did since its last commit is kept before a request that keeps us
        # waiting (a streamed one's first text commits it)
        await state.lane.run(journal.commit, state, [])
    with tracing.model_span(state, step):
        try:
            answer = await _attempts(state, step, model, body, params)
        except FallingBack as falling:
            # the next model of the agent's fallback answers this same step (a new attempt)
            state.models_seen -= 1
            raise falling.error from None
        except TurnCut as stopped:
            record_cut_turn(state, step, stopped.answer, params)
            raise await journal.ended(state, Cancelled(stopped.answer.text)) from None
        record_model_step(state, step, answer, params)
    record_durable_unit(executed=True)
    return answer.payload


def _model(state: SliceState, model_id: str | None) -> Model:
    pa_agent = state.agent.pydantic_agent
    if model_id is None:
        return pa_agent.model
    if model_id.startswith("fallback-"):
        return fallback_models(pa_agent)[model_id]
    return model_for(model_id)


def _superseded(state: SliceState, step: Step) -> None:
    crashed(state, step, "worker died mid-stream")
    state.pending.events.append(
        (EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": step.attempts})
    )


async def _attempts(state: SliceState, step: Step, model: Model, body: Any, params: Any) -> Answer:
    outage: ModelOutage | None = None
    while True:
        await model_slot.wait_for_slot(state, model, params)
        attempt = step.attempts + 1
        try:
            if streams(model):
                return await _streamed(state, step, attempt, model, body)
            return await _whole(attempt, model, body)
        except ModelError as exc:
            if fallback_left(params) and isinstance(exc.__cause__, Exception):
                await state.lane.run(_record_failure, state, step, attempt, exc, final=False)
                step.status = StepStatus.PENDING
                stage(state.pending.batch, step, ["status"])
                raise FallingBack(exc.__cause__) from None
            outage = outage or await state.lane.run(ModelOutage.resume, state.run.id, step.index)
            until = await state.lane.run(_failed, state, step, attempt, exc, outage)
            await _backed_off(state, outage, exc, until)


async def _whole(attempt: int, model: Model, body: Any) -> Answer:
    """A model that does not stream: the body, awaited here; its whole text is one delta."""
    started = timezone.now()
    try:
        payload = await body()
    except stops.TurnStopped:
        raise cut_turn(attempt, started, "", "") from None
    except Exception as exc:
        raise _classified(model, exc) from exc
    text = storable_text(
        "".join(
            p.get("content", "") for p in payload.get("parts", ()) if p.get("part_kind") == "text"
        )
    )
    return Answer(payload, attempt, started, text, text)


async def _backed_off(state: SliceState, outage: ModelOutage, exc: ModelError, until: Any) -> None:
    """Wait an outage out: here when the wait is short, else queued with a delayed doorbell."""
    wait = (until - timezone.now()).total_seconds()
    if state.drain is not None and wait > conf.RETRY_SLEEP_MAX_SECONDS:
        why = {"reason": outage.reason(exc), "model_outage": outage.state()}
        raise await journal.ended(state, BackingOff(until, why))
    if not await journal.wait_for_retry(state, until):
        raise await journal.ended(state, Cancelled())


def _failed(
    state: SliceState, step: Step, attempt: int, exc: ModelError, outage: ModelOutage
) -> Any:
    """What a failed attempt does: the run fails (a verdict: raises the slice's end), or it
    waits the outage out (returns when to try again)."""
    streamed = not _attempt_is_new(step, attempt)
    if not exc.retryable or (streamed and attempt >= conf.MODEL_MAX_ATTEMPTS):
        _record_failure(state, step, attempt, exc, final=True)
        raise SliceEnds(journal.end(state, Failed(f"model error: {exc}")))
    if streamed:
        _record_failure(state, step, attempt, exc, final=False)
    wait = outage.failed(exc)
    if wait is None:  # down for AGENTRUNS_MODEL_OUTAGE_SECONDS: the step fails
        verdict = outage.verdict(exc)
        _record_failure(state, step, step.attempts + 1, verdict, final=True)
        raise SliceEnds(journal.end(state, Failed(f"model error: {verdict}")))
    return timezone.now() + timedelta(seconds=wait)


def _record_failure(
    state: SliceState, step: Step, attempt: int, exc: ModelError, *, final: bool
) -> None:
    now = timezone.now()
    error = redact_text(storable_text(str(exc)))
    process_health.model_error(exc)
    tracing.model_attempt_failed(attempt, exc, final=final)
    streamed = not _attempt_is_new(step, attempt)  # its deltas were flushed: superseded
    step.error = error
    step.status = StepStatus.FAILED if final else StepStatus.RUNNING
    if final:
        step.finished_at = now
    ended = {
        "finished_at": now,
        "outcome": AttemptOutcome.FAILED if final else AttemptOutcome.RETRYING,
        "error": error,
    }
    batch = WriteBatch()
    if streamed:
        stage(batch, step, ["error", "status", "finished_at"])
        end_attempt(batch, step, attempt, **ended)
    else:
        begin_attempt(
            batch,
            step,
            attempt,
            state.owner,
            now,
            update_fields=["error", "finished_at"],
            **ended,
        )
    kind = EventType.STEP_FAILED if final else EventType.STEP_RETRY_SCHEDULED
    events = [(kind, step_event_data(step))]
    if streamed and not final:  # the next attempt streams the turn again from scratch
        events.append((EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": attempt}))
    journal.commit(state, events, batch=batch)


# ------------------------------------------------------------------ inside the unit's body
async def request_model(model: Model, params: Any, ctx: Any, handler: Any = None) -> ModelResponse:
    """The request itself (the unit's body): streamed when the model can, each text delta
    handed to the unit (`deliver_delta`) and every event to the agent's event stream `handler`
    (when the loop asked for a streamed request), else asked whole. A stop of the run cancels
    it (`stops.stoppable`: `TurnStopped`), closing the model's stream."""
    state = current_or_none()
    async with stops.stoppable(state.run.id if state is not None else None):
        if not streams(model):
            response = await model.request(
                params.messages, params.model_settings, params.model_request_parameters
            )
        else:
            async with open_durable_unit_stream(
                model, params.messages, params.model_settings, params.model_request_parameters, ctx
            ) as streamed:
                if handler is None:
                    async for event in streamed:
                        if text := _text(event):
                            await deliver_delta(text)
                else:
                    await consume_event_stream(
                        run_context=ctx, stream=_delivered(streamed), handler=handler
                    )
            response = streamed.get()
    usage_for = getattr(model, "usage_for", None)
    if usage_for is not None:  # the scripted model: the engine's estimate
        response.usage = usage_for(params.messages, response)
    elif not (response.usage.input_tokens or response.usage.output_tokens):
        response.usage = estimated_usage(params.messages, response)  # a server that says none
    return response


async def _delivered(streamed: Any) -> Any:
    async for event in streamed:
        if text := _text(event):
            await deliver_delta(text)
        yield event


def _classified(model: Model, exc: Exception) -> BaseException:
    """What a failed request raises: ModelError (an outage to wait out, or a verdict); a
    configuration error or the scripted model's policy failing, as it is."""
    from pydantic_ai.exceptions import UserError

    from agentruns.runtime.providers.scripted_model import ScriptedModel

    if isinstance(exc, ModelError | UserError) or isinstance(model, ScriptedModel):
        return exc
    name = name_of(model) or ""
    openai = pydantic_ai_name(name).startswith(openai_compatible.PREFIXES) if name else False
    return model_error(exc, openai_compatible.endpoint() if openai else None)


# ------------------------------------------------------------------ a model that streams
# the first text of a turn is shown at once when the model took this long to say anything
FIRST_DELTA_AFTER_S = 0.005


class SinkFailed(Exception):
    """Handing a delta on failed (a lost lease, a stopped delta feed, the database): raised out
    of the model's stream as it is, never classified as the model's failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class StreamedText:
    """The text of one attempt as it streams, in the run's own task: the first flush is the
    step's own commit; later text goes to the process's delta writer in a worker (batched
    commits of its own in-process)."""

    def __init__(self, state: SliceState, step: Step, attempt: int, started: Any) -> None:
        self.state, self.step, self.attempt, self.started = state, step, attempt, started
        self.text: list[str] = []
        self.pending = ""  # the text no delta event carries yet
        self.feed: DeltaFeed | None = None
        self.flushed = False
        self.last_flush = time.monotonic()

    async def deliver(self, delta: str) -> None:
        try:
            await self._take(delta)
        except Exception as exc:
            raise SinkFailed(exc) from exc

    async def _take(self, delta: str) -> None:
        piece = storable_text(delta)
        self.text.append(piece)
        state = self.state
        if self.feed is not None:
            self.feed.add(piece)
            journal.check_lease(state)
            return
        self.pending += piece
        since = time.monotonic() - self.last_flush
        if not (
            len(self.pending) >= conf.DELTA_FLUSH_CHARS
            or since >= conf.DELTA_FLUSH_MS / 1000.0
            or (not self.flushed and since >= FIRST_DELTA_AFTER_S)
        ):
            return
        text, self.pending = self.pending, ""
        await state.lane.run(_flush_delta, state, self.step, self.attempt, text, self.started)
        self.last_flush, self.flushed = time.monotonic(), True
        if state.cancel_requested:  # read by that commit: the stop's second way in
            stops.deliver(state.run.id)
        failpoints.hit("model_streaming", tool=state.run.agent, step_id=self.step.id)
        if state.drain is not None:  # a worker: the process's deltas go out together
            self.feed = delta_writer().open(
                state.run.id,
                state.owner,
                self.step.index,
                self.attempt,
                lambda cancel: _feed_committed(state, cancel),
            )

    async def close(self, *, failed: bool = False) -> str:
        """The feed's unwritten text (closing waits for a flush in flight: then on the lane)."""
        if self.feed is None:
            return ""
        feed, self.feed = self.feed, None
        closed = feed.close_now(raise_failure=not failed)
        if closed is None:
            closed = await self.state.lane.run(feed.close, raise_failure=not failed)
        return closed


_delivering: ContextVar[StreamedText | None] = ContextVar("agentruns_delivering", default=None)


async def deliver_delta(text: str) -> bool:
    """Inside a model unit's body: hand `text` on (False: no unit takes deltas here)."""
    sink = _delivering.get()
    if sink is None:
        return False
    await sink.deliver(text)
    return True


@contextmanager
def delivering(sink: Any) -> Iterator[None]:
    """Deltas of the requests inside go to `sink.deliver` (the unit's, or a test's)."""
    token = _delivering.set(sink)
    try:
        yield
    finally:
        _delivering.reset(token)


def _text(event: Any) -> str:
    if isinstance(event, PartDeltaEvent):
        return event.delta.content_delta if isinstance(event.delta, TextPartDelta) else ""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    return ""


def _attempt_is_new(step: Step, attempt: int) -> bool:
    """No row of this attempt was written yet (nothing streamed by it)."""
    return step._state.adding or step.attempts < attempt


async def _streamed(state: SliceState, step: Step, attempt: int, model: Model, body: Any) -> Answer:
    """A model that streams: its text committed as it comes (`StreamedText`)."""
    sink = StreamedText(state, step, attempt, timezone.now())
    done = False
    try:
        with delivering(sink):
            payload = await body()
        done = True
    except SinkFailed as failed:
        raise failed.error from None  # the engine's own error (a lost lease), not the model's
    except stops.TurnStopped:
        done = True  # the text so far stands: the writer's unwritten rest goes in our commit
        tail = sink.pending + await sink.close()
        raise cut_turn(attempt, sink.started, "".join(sink.text), tail) from None
    except Exception as exc:
        raise _classified(model, exc) from exc
    finally:
        if not done and sink.feed is not None:  # failed: its text is superseded, its error stands
            await sink.close(failed=True)
    # before our own commit: the text the writer has not written yet
    tail = sink.pending + await sink.close()
    return Answer(payload, attempt, sink.started, "".join(sink.text), tail)


def _feed_committed(state: SliceState, cancel_requested: bool) -> None:
    state.cancel_requested = state.cancel_requested or cancel_requested
    if cancel_requested:  # the flush read a cancel: the turn in flight stops now
        stops.deliver(state.run_id)
    if state.heartbeat is not None:
        state.heartbeat.renewed()


def _flush_delta(state: SliceState, step: Step, attempt: int, text: str, started: Any) -> None:
    """One commit: the streamed text (and, on the attempt's first flush, the step as running
    with its attempt row), with what the slice has not committed yet."""
    events = []
    batch = None
    if _attempt_is_new(step, attempt):
        batch = WriteBatch()
        step.status = StepStatus.RUNNING
        begin_attempt(batch, step, attempt, state.owner, started)
        events.append((EventType.STEP_STARTED, step_event_data(step, error="")))
    events.append((EventType.MODEL_DELTA, {"step": step.index, "attempt": attempt, "text": text}))
    journal.commit(state, events, batch=batch)
    journal.check_lease(state)
