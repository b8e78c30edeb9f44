"""The model request unit: the n-th model request of the agent's loop is the run's n-th model
step (DESIGN.md 4.4, 4.10, 4.11).

Replayed: a step that succeeded returns what it recorded (its `payload`, the ModelResponse; a
step of the engine before this one: rebuilt from its text and calls). Executed: the slice's
boundary is checked (`boundary.py`), then attempts as the engine always made them: a failure
before any text is an outage the run waits out (no attempt counted), an attempt that streamed
text is an attempt and its text is superseded. A model that streams is asked on the process's
model-stream loop (`stream_pump.run_streaming`): its first delta is the step's own commit (the
step running, its attempt row, the text), later deltas go to the process's delta writer; one
that does not stream is asked whole, its text one delta in the step's commit. The step's result
and the tool calls it asked for (planned as rows: `plan.py`) wait in the slice's pending batch
for its next commit.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

from django.utils import timezone
from pydantic_ai.durable_exec import JSON_CODEC, record_durable_unit
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models._request_timeout import open_durable_unit_stream
from pydantic_ai.usage import RequestUsage

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, RunStatus, Step, StepKind, StepStatus
from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime import tracing
from agentruns.runtime.dispatch import connections
from agentruns.runtime.engine import model_slot, status
from agentruns.runtime.engine.plan import (
    Answer,
    begin_attempt,
    end_attempt,
    record_model_step,
    replayed,
    stage,
)
from agentruns.runtime.engine.slice import SliceState, island
from agentruns.runtime.engine.status import check_boundary, wait_for_retry
from agentruns.runtime.events import EventType, step_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.execution.delta_writer import DeltaFeed, delta_writer
from agentruns.runtime.outages import process_health
from agentruns.runtime.outages.model_outage import ModelOutage
from agentruns.runtime.providers import ModelError, TextSink, openai_compatible
from agentruns.runtime.providers.model_errors import model_error
from agentruns.runtime.providers.models import (
    estimated_usage,
    model_for,
    name_of,
    streams,
    waits,
)
from agentruns.runtime.providers.stream_pump import (
    SinkFailed,
    _text,
    deliver_delta,
    run_streaming,
)
from agentruns.runtime.store.rows import WriteBatch, build
from agentruns.runtime.values.ids import step_key
from agentruns.runtime.values.redaction import redact_text
from agentruns.runtime.values.text import storable_text

# the first text of a turn is shown at once when the model took this long to say anything
FIRST_DELTA_AFTER_S = 0.005


# ------------------------------------------------------------------ inside the unit's body
async def request_model(model: Model, params: Any, ctx: Any) -> ModelResponse:
    """The request itself (the unit's body): streamed when the model can, each text delta
    handed to the unit (`deliver_delta`), else asked whole."""
    if not streams(model):
        response = await model.request(
            params.messages, params.model_settings, params.model_request_parameters
        )
    else:
        async with open_durable_unit_stream(
            model, params.messages, params.model_settings, params.model_request_parameters, ctx
        ) as streamed:
            async for event in streamed:
                if text := _text(event):
                    await deliver_delta(text)
        response = streamed.get()
    usage_for = getattr(model, "usage_for", None)
    if usage_for is not None:  # the scripted model: the engine's estimate
        response.usage = usage_for(params.messages, response)
    elif not (response.usage.input_tokens or response.usage.output_tokens):
        response.usage = estimated_usage(params.messages, response)  # a server that says none
    return response


# ------------------------------------------------------------------ replay
def recorded(step: Step) -> Any:
    """What a succeeded model step returns on replay (the JSON codec's form)."""
    if step.payload is not None:
        return replayed(step.payload)
    parts: list[Any] = [TextPart(step.text)] if step.text else []
    for call in step.tool_calls or []:
        parts.append(ToolCallPart(call["name"], call["arguments"], tool_call_id=call["id"]))
    usage = RequestUsage(input_tokens=step.prompt_tokens, output_tokens=step.completion_tokens)
    return JSON_CODEC.dump(ModelResponse, ModelResponse(parts=parts, usage=usage))


# ------------------------------------------------------------------ the unit
async def execute(state: SliceState, model_id: str | None, body: Any, params: Any) -> Any:
    position = state.models_seen
    state.models_seen += 1
    step = state.model_steps[position] if position < len(state.model_steps) else None
    if step is not None and step.status == StepStatus.SUCCEEDED:
        record_durable_unit(executed=False)
        return recorded(step)
    with island():
        check_boundary(state, model=step is None or step.status != StepStatus.RUNNING)
        if step is None:
            step_id = uuid.uuid4()
            step = build(
                Step,
                id=step_id,
                run_id=state.run.id,
                index=len(state.steps),
                kind=StepKind.MODEL,
                idempotency_key=step_key(state.run.id, step_id),
                status=StepStatus.RUNNING,
            )
            state.add_step(step)
        elif step.status == StepStatus.RUNNING:
            _superseded(state, step)  # left running by a dead worker: a new attempt
        if state.pending:  # what the slice did since its last commit is kept before we go on
            state.executor.commit([])
    model = _model(state, model_id)
    with tracing.model_span(state.executor, step):
        answer = await _attempts(state, step, model, body, params)
        with island():
            record_model_step(state, step, answer, params)
    record_durable_unit(executed=True)
    return answer.payload


def _model(state: SliceState, model_id: str | None) -> Model:
    if model_id is None:
        return state.agent.pydantic_agent.model
    return model_for(model_id)


def _superseded(state: SliceState, step: Step) -> None:
    tracing.worker_lost(state.executor, step)
    batch = state.pending.batch
    end_attempt(
        batch,
        step,
        step.attempts,
        outcome=AttemptOutcome.CRASHED,
        error="worker died mid-stream",
        finished_at=timezone.now(),
    )
    step.status = StepStatus.PENDING
    stage(batch, step, ["status"])
    state.pending.events.append(
        (EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": step.attempts})
    )


async def _attempts(state: SliceState, step: Step, model: Model, body: Any, params: Any) -> Answer:
    outage: ModelOutage | None = None
    while True:
        with island():
            model_slot.wait_for_slot(state, model, params)
        attempt = step.attempts + 1
        try:
            if streams(model):
                with island():
                    return _streamed(state, step, attempt, model, body)
            return await _whole(state, attempt, model, body)
        except ModelError as exc:
            with island():
                outage = _failed(state, step, attempt, exc, outage)


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


async def _whole(state: SliceState, attempt: int, model: Model, body: Any) -> Answer:
    """A model that does not stream: the body, awaited here; its whole text is one delta."""
    started = timezone.now()
    if waits(model):
        with island():
            connections.release()
    try:
        payload = await body()
    except SinkFailed as failed:
        raise failed.error from None
    except Exception as exc:
        raise _classified(model, exc) from exc
    text = storable_text(
        "".join(
            p.get("content", "") for p in payload.get("parts", ()) if p.get("part_kind") == "text"
        )
    )
    return Answer(payload, attempt, started, text, text)


def _attempt_is_new(step: Step, attempt: int) -> bool:
    """No row of this attempt was written yet (nothing streamed by it)."""
    return step._state.adding or step.attempts < attempt


def _failed(
    state: SliceState, step: Step, attempt: int, exc: ModelError, outage: ModelOutage | None
) -> ModelOutage:
    """What a failed attempt does: the run fails (a verdict), or it waits the outage out."""
    executor = state.executor
    streamed = not _attempt_is_new(step, attempt)
    if not exc.retryable or (streamed and attempt >= conf.MODEL_MAX_ATTEMPTS):
        _record_failure(state, step, attempt, exc, final=True)
        raise status.fail(executor, f"model error: {exc}")
    if streamed:
        _record_failure(state, step, attempt, exc, final=False)
    outage = outage or ModelOutage.resume(state.run.id, step.index)
    wait = outage.failed(exc)
    if wait is None:  # down for AGENTRUNS_MODEL_OUTAGE_SECONDS: the step fails
        verdict = outage.verdict(exc)
        _record_failure(state, step, step.attempts + 1, verdict, final=True)
        raise status.fail(executor, f"model error: {verdict}")
    until = timezone.now() + timedelta(seconds=wait)
    if state.drain is not None and wait > conf.RETRY_SLEEP_MAX_SECONDS:
        why = {"reason": outage.reason(exc), "model_outage": outage.state()}
        raise status.ends(RunStatus.QUEUED, lambda: status.back_off(executor, until, **why))
    connections.release()
    if not wait_for_retry(executor, until):
        raise status.cancelled(executor)
    return outage


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
            state.executor.owner,
            now,
            update_fields=["error", "finished_at"],
            **ended,
        )
    kind = EventType.STEP_FAILED if final else EventType.STEP_RETRY_SCHEDULED
    events = [(kind, step_event_data(step))]
    if streamed and not final:  # the next attempt streams the turn again from scratch
        events.append((EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": attempt}))
    state.executor.commit(events, batch=batch)


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
