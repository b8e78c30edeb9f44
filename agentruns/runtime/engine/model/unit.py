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

from datetime import timedelta
from typing import Any

from django.utils import timezone
from pydantic_ai.durable_exec import record_durable_unit
from pydantic_ai.models import Model

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, RunStatus, Step, StepKind, StepStatus
from agentruns.runtime import tracing
from agentruns.runtime.conversations.transcript import recorded
from agentruns.runtime.dispatch import connections, stops
from agentruns.runtime.engine import status
from agentruns.runtime.engine.model import slot as model_slot
from agentruns.runtime.engine.model.request import _classified
from agentruns.runtime.engine.model.streamed import _attempt_is_new, _streamed
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
from agentruns.runtime.engine.slice import SliceState, island
from agentruns.runtime.engine.status import check_boundary, wait_for_retry
from agentruns.runtime.engine.waits import record_answered_elsewhere
from agentruns.runtime.events import EventType, step_event_data
from agentruns.runtime.outages import process_health
from agentruns.runtime.outages.model_outage import ModelOutage
from agentruns.runtime.providers import ModelError
from agentruns.runtime.providers.model_fallback import FallingBack, fallback_left, fallback_models
from agentruns.runtime.providers.models import model_for, streams, waits
from agentruns.runtime.providers.stream_pump import (
    SinkFailed,
)
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.redaction import redact_text
from agentruns.runtime.values.text import storable_text


# ------------------------------------------------------------------ the unit
async def execute(state: SliceState, model_id: str | None, body: Any, params: Any) -> Any:
    position = state.models_seen
    if position >= len(state.model_steps):  # a new request: its calls' answers came back
        with island():
            record_answered_elsewhere(state, params.messages)
    state.models_seen += 1
    step = state.model_steps[position] if position < len(state.model_steps) else None
    if step is not None and step.status == StepStatus.SUCCEEDED:
        record_durable_unit(executed=False)
        return recorded(step)
    with island():
        check_boundary(state, model=step is None or step.status != StepStatus.RUNNING)
        if step is None:
            step = new_step(state, StepKind.MODEL, status=StepStatus.RUNNING)
            state.add_step(step)
        elif step.status == StepStatus.RUNNING:
            _superseded(state, step)  # left running by a dead worker: a new attempt
        if state.pending:  # what the slice did since its last commit is kept before we go on
            state.executor.commit([])
    model = _model(state, model_id)
    with tracing.model_span(state.executor, step):
        try:
            answer = await _attempts(state, step, model, body, params)
        except FallingBack as falling:
            # the next model of the agent's fallback answers this same step (a new attempt)
            state.models_seen -= 1
            raise falling.error from None
        except TurnCut as stopped:
            with island():
                record_cut_turn(state, step, stopped.answer, params)
            raise status.cancelled(state.executor, output=stopped.answer.text) from None
        with island():
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
                if fallback_left(params) and isinstance(exc.__cause__, Exception):
                    _record_failure(state, step, attempt, exc, final=False)
                    step.status = StepStatus.PENDING
                    stage(state.pending.batch, step, ["status"])
                    raise FallingBack(exc.__cause__) from None
                outage = _failed(state, step, attempt, exc, outage)


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
