"""The rows a unit stages for the slice's next commit: a step's attempts, a model step's result
and the tool calls it asked for, planned as rows (DESIGN.md 4.4, 4.8).

A step and its attempt rows are built unsaved (`store/rows.build`) and put into the slice's
pending batch; the executor's next commit hands it to the one writer. A row the batch already
inserts carries every change made to it before that commit (the store serialises it then), so
`stage` adds an update only for a row that is in the database already.

Planning: every tool call of a model response is a tool step, in the order the model gave them,
created pending with its idempotency key in the commit that records the response, except the
calls of output tools (a structured output: the run's output, not a step). A bad call (unknown,
outside the run's permission snapshot, arguments that are not JSON or fail the tool's schema,
or name something outside the run's scope: `access/scope.py`) is planned as a failed step whose
error goes back to the model.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from django.utils import timezone
from pydantic_ai.durable_exec import JSON_CODEC
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, Step, StepAttempt, StepKind, StepStatus
from agentruns.registry import ToolArgumentsError, UnknownTool, get_tool
from agentruns.runtime import tracing
from agentruns.runtime.access import scope
from agentruns.runtime.access.permissions import refused_message
from agentruns.runtime.engine.slice import SliceState
from agentruns.runtime.events import (
    EventType,
    planned_event_data,
    step_event_data,
)
from agentruns.runtime.providers.base import Usage
from agentruns.runtime.providers.costs import model_cost_usd
from agentruns.runtime.providers.models import estimated_usage
from agentruns.runtime.store.rows import WriteBatch, build
from agentruns.runtime.values.ids import step_key
from agentruns.runtime.values.text import UnsafeValue, loads_strict, storable, storable_text

MODEL_STEP_FIELDS = [
    "status",
    "text",
    "tool_calls",
    "prompt_tokens",
    "completion_tokens",
    "payload",
    "finished_at",
    "error",
]


# ------------------------------------------------------------------ recorded payloads
def journal_text(payload: Any) -> str:
    """A unit's payload as the journal keeps it: JSON text, byte for byte what it returned (a
    replayed conversation is then the very one the model was sent)."""
    try:
        return orjson.dumps(payload).decode()
    except TypeError:  # a lone surrogate, a number beyond 64 bits: the json module writes those
        return json.dumps(payload, ensure_ascii=True)


def replayed(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


# ------------------------------------------------------------------ rows
def stage(batch: WriteBatch, obj: Any, fields: list[str]) -> None:
    """The change of `fields` of `obj` goes out with the batch (an insert carries it as is)."""
    if obj._state.adding:
        if not any(row is obj for row in batch.inserts):
            batch.insert([obj])
        return
    batch.update(obj, fields)


def attempt_row(step: Step, number: int, owner: str, started: Any, **values: Any) -> StepAttempt:
    return build(
        StepAttempt,
        {"step": step},
        step_id=step.id,
        number=number,
        worker=owner,
        started_at=started,
        **values,
    )


def begin_attempt(
    batch: WriteBatch,
    step: Step,
    number: int,
    owner: str,
    started: Any,
    *,
    update_fields: list[str] = (),
    **attempt_values: Any,
) -> None:
    """Into `batch`: the step on attempt `number` (its insert, or an update of `update_fields`
    and its attempt fields) and that attempt's row (with `attempt_values`)."""
    step.attempts = number
    step.started_at = step.started_at or started
    stage(batch, step, list(dict.fromkeys([*update_fields, "status", "attempts", "started_at"])))
    batch.insert([attempt_row(step, number, owner, started, **attempt_values)])


def end_attempt(batch: WriteBatch, step: Step, number: int, **values: Any) -> None:
    """Into `batch`: attempt `number` of `step` ends with `values` (one this batch inserts is
    changed in place)."""
    for row in batch.inserts:
        if isinstance(row, StepAttempt) and row.step_id == step.id and row.number == number:
            for name, value in values.items():
                setattr(row, name, value)
            return
    row = build(StepAttempt, step_id=step.id, number=number, **values)
    batch.update(row, list(values), where={"step": step.id, "number": number})


def crashed(state: Any, step: Step, error: str) -> None:
    """Into the slice's pending batch: the open attempt of a step left `running` by a dead
    worker ended as crashed, the step pending again (its next attempt runs it anew)."""
    tracing.worker_lost(state, step)
    batch = state.pending.batch
    end_attempt(
        batch,
        step,
        step.attempts,
        outcome=AttemptOutcome.CRASHED,
        error=error,
        finished_at=timezone.now(),
    )
    step.status = StepStatus.PENDING
    stage(batch, step, ["status"])


# ------------------------------------------------------------------ a model step's result
@dataclass(slots=True)
class Answer:
    """What one attempt of a model step returned: its payload and what its commit records."""

    payload: Any  # the ModelResponse, as the JSON codec dumped it
    attempt: int
    started: Any
    text: str
    tail: str  # the end of `text` that no delta event carries yet


def _calls(payload: Any) -> list[dict]:
    return [p for p in payload.get("parts", ()) if p.get("part_kind") == "tool-call"]


def _raw_arguments(args: Any) -> str:
    import json

    return args if isinstance(args, str) else json.dumps(args or {})


def record_model_step(state: SliceState, step: Step, answer: Answer, params: Any) -> None:
    """Into the slice's pending batch: the model step succeeded (its text, calls, tokens and
    payload), the tool steps it asked for, its events, and the run's counters."""
    now = timezone.now()
    pending = state.pending
    batch, events = pending.batch, pending.events
    payload = answer.payload
    usage = payload.get("usage") or {}
    tokens = Usage(
        prompt_tokens=int(usage.get("input_tokens") or 0),
        completion_tokens=int(usage.get("output_tokens") or 0),
    )
    calls = _calls(payload)
    step.status, step.text, step.error, step.finished_at = (
        StepStatus.SUCCEEDED,
        answer.text,
        "",
        now,
    )
    step.tool_calls = storable(
        [
            {
                "id": c.get("tool_call_id") or "",
                "name": c.get("tool_name") or "",
                "arguments": _raw_arguments(c.get("args")),
            }
            for c in calls
        ]
    )
    step.prompt_tokens, step.completion_tokens = tokens.prompt_tokens, tokens.completion_tokens
    step.payload = journal_text(payload)
    if step._state.adding or step.attempts < answer.attempt:  # nothing streamed: rows now
        begin_attempt(
            batch,
            step,
            answer.attempt,
            state.owner,
            answer.started,
            update_fields=MODEL_STEP_FIELDS,
            finished_at=now,
            outcome=AttemptOutcome.SUCCEEDED,
        )
        events.append(
            (EventType.STEP_STARTED, step_event_data(step, status=StepStatus.RUNNING, error=""))
        )
    else:
        stage(batch, step, MODEL_STEP_FIELDS)
        end_attempt(batch, step, answer.attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED)
    if answer.tail:
        events.append(
            (
                EventType.MODEL_DELTA,
                {"step": step.index, "attempt": answer.attempt, "text": answer.tail},
            )
        )
    events.append((EventType.STEP_SUCCEEDED, step_event_data(step)))
    outputs = {t.name for t in getattr(params.model_request_parameters, "output_tools", ())}
    for call in calls:
        if call.get("tool_name") in outputs:
            continue  # the run's output, not a step
        planned = _plan(state, call, now)
        stage(batch, planned, [])
        events.append((EventType.STEP_PLANNED, planned_event_data(state.run, planned)))
    run = state.run
    cost = model_cost_usd(run.model or conf.MODEL, tokens)
    run.prompt_tokens += tokens.prompt_tokens
    run.completion_tokens += tokens.completion_tokens
    run.cost_usd = Decimal(run.cost_usd) + cost
    pending.set_fields["step_count"] = len(state.steps)
    for name, value in (
        ("prompt_tokens", tokens.prompt_tokens),
        ("completion_tokens", tokens.completion_tokens),
        ("cost_usd", cost),
    ):
        pending.incr_fields[name] = pending.incr_fields.get(name, 0) + value


# ------------------------------------------------------------------ a turn a stop cut short
# (`dispatch/stops.py`): the model unit catches the request's `TurnStopped` and raises `TurnCut`
# with the text the attempt streamed; that text is the step's result (succeeded, no tool calls: a
# partial answer is never acted on) and the run's output, in the commit that ends the run
class TurnCut(Exception):
    """The turn was stopped mid-request: `answer` holds the text it streamed so far."""

    def __init__(self, answer: Answer) -> None:
        super().__init__("stopped on request")
        self.answer = answer


def cut_turn(attempt: int, started: Any, text: str, tail: str) -> TurnCut:
    """`text`: all the attempt streamed; `tail`: its end that no delta event carries yet."""
    # the JSON codec's form of `ModelResponse(parts=[TextPart(text)])`, written out: the codec's
    # first dump in a process builds its schema (~80 ms), and a stop must not wait for that
    parts = [{"part_kind": "text", "content": text}] if text else []
    return TurnCut(Answer({"parts": parts, "kind": "response"}, attempt, started, text, tail))


def record_cut_turn(state: SliceState, step: Step, answer: Answer, params: Any) -> None:
    """Into the pending batch: the turn's text so far as its result; a turn stopped before it
    said anything leaves no step (nothing of it was written), or, one a dead worker left
    running, skipped."""
    streamed = not (step._state.adding or step.attempts < answer.attempt)
    if answer.text or streamed:
        # the server's usage comes at the stream's end, which a cut never reads: the prompt was
        # sent and the text so far was made, so the run's budgets count the estimate
        said = ModelResponse(parts=[TextPart(answer.text)] if answer.text else [])
        answer.payload["usage"] = JSON_CODEC.dump(
            RequestUsage, estimated_usage(params.messages, said)
        )
        record_model_step(state, step, answer, params)
    elif not step._state.adding:
        step.status, step.finished_at = StepStatus.SKIPPED, timezone.now()
        stage(state.pending.batch, step, ["status", "finished_at"])


def new_step(state: SliceState, kind: str, **fields: Any) -> Step:
    """The run's next step (not saved: the slice's next commit inserts it), with its stable
    idempotency key from the moment it exists."""
    step_id = uuid.uuid4()
    return build(
        Step,
        id=step_id,
        run_id=state.run.id,
        index=len(state.steps),
        kind=kind,
        idempotency_key=step_key(state.run.id, step_id),
        **fields,
    )


def _plan(state: SliceState, call: dict, now: Any) -> Step:
    name, call_id = str(call.get("tool_name") or ""), str(call.get("tool_call_id") or "")
    step = new_step(state, StepKind.TOOL, tool=name[:100], call_id=call_id[:100])
    try:
        step.arguments = _validated_arguments(state, name, call.get("args"))
        scope.check_call(state.run, name, step.arguments)  # outside what the run is about
    except (ToolArgumentsError, UnknownTool) as exc:
        step.status = StepStatus.FAILED
        step.error = storable_text(str(exc))
        step.finished_at = now
    state.add_step(step)
    return step


def refuse_planned(state: SliceState, step: Step, error: str) -> None:
    """A planned call turned out bad (the tool's own validation): a failed step, as if the
    engine had refused it when it planned it."""
    step.status, step.error, step.finished_at = (
        StepStatus.FAILED,
        storable_text(error),
        timezone.now(),
    )
    stage(state.pending.batch, step, ["status", "error", "finished_at"])


def _validated_arguments(state: SliceState, name: str, args: Any) -> dict:
    if not state.run.tool_allowed(name):
        raise UnknownTool(refused_message(state.run, name))
    if isinstance(args, dict):
        arguments: Any = args
    else:
        try:
            # strict: a NaN, a 5000-digit number or a NUL could not be stored as the arguments
            arguments = loads_strict(args or "{}", "arguments", repair_text=True)
        except UnsafeValue as exc:
            problem = str(exc).removeprefix("malformed JSON: ")
            raise ToolArgumentsError(f"{name}: arguments are not valid JSON ({problem})") from None
    return get_tool(name).validate(arguments)
