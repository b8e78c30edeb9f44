"""Where a resumed slice starts: the run's latest resume point instead of the run's start.

A slice that ends before its run does (a park for a person, an event or a timer, a yield, a
back-off) stores, in the commit that ends it, the agent's messages as they were just before the
latest model request it made (`ResumePoint`), with the journal's counters and the loop's usage
and step number then. The next slice gives Pydantic AI those messages as its history and no new
prompt: the loop sends that trailing request again (a new model step when it was never answered,
its recorded answer when it was) and goes on from there, so a resumed slice replays at most one
model step and its calls, never the run's whole history (issue 43, item 2).

The loop started from a history must be the loop that went on from it, so a point is stored only
where nothing the history cannot carry changes what the loop does next:
- no retry counted yet (a `RetryPromptPart` in the history or a tool's retries in the request's
  run context): Pydantic AI counts retries per run, and a loop started afresh would count from
  zero;
- the trailing request carries no user prompt (a run's first request: its start is as cheap).
The resumed loop is driven node by node (`agent_run.next`), which streams each node to the
agent's event stream capabilities (`ProcessEventStream`) as `agent.run()` does; an
`Agent.event_stream_handler` of its own is always None in the pinned Pydantic AI, and the engine
passes none to `run()`.
Elsewhere no point is stored and the slice resumes from the latest one stored before, or the
run's start: everything after a point is in the journal, so an older point is never wrong.

A resumed loop gets back what `agent.run(prompt)` would have had at that request:
`RunContext.prompt` (instructions read it) and the step number (`pydantic_ai_private.start_at`);
the usage is handed to the run; the run's own messages lose their `run_id` (Pydantic AI refuses a
history that already holds the id of the run it starts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage

from agentruns.models import ResumePoint, StepStatus
from agentruns.runtime.engine.slice import SliceState

RUN_USAGE = TypeAdapter(RunUsage)
# what a newer point of a run replaces of its older one: all of it but the run it belongs to
POINT_FIELDS = [f.name for f in ResumePoint._meta.concrete_fields if not f.primary_key]


@dataclass(slots=True)
class RequestMark:
    """The loop just before the slice's latest model request: where a point would be."""

    position: int  # the request's place among the run's model requests (0: the first)
    entries_seen: int
    waits_seen: int
    run_step: int  # Pydantic AI's step number before the request
    messages: list[Any]  # the history the request was made with, its trailing request last
    usage: dict[str, Any]  # the loop's usage before the request (RunUsage as JSON)
    retried: bool  # a tool's retries counted in the request's run context


def mark_request(state: SliceState, position: int, params: Any) -> None:
    """Called as the loop makes its `position`-th model request (replayed or not), with the
    journal's counters as they are before it."""
    ctx = params.run_context
    if ctx is None or position == 0:
        state.request_mark = None
        return
    state.request_mark = RequestMark(
        position=position,
        entries_seen=state.entries_seen,
        waits_seen=state.waits_seen,
        run_step=ctx.run_step - 1,
        messages=list(params.messages),
        usage=RUN_USAGE.dump_python(ctx.usage, mode="json"),
        retried=any(ctx.retries.values()),
    )


def store(state: SliceState) -> None:
    """In the commit that ends the slice (parked, yielded, backing off): the run's resume point
    at the slice's latest model request, when the loop can start there (module docstring)."""
    mark = state.request_mark
    if mark is None or mark.retried or mark.position > len(state.model_steps):
        return
    answered = state.model_steps[mark.position - 1]
    if answered.status != StepStatus.SUCCEEDED or not _startable(mark.messages):
        return
    try:
        messages = ModelMessagesTypeAdapter.dump_json(mark.messages).decode()
    except ValueError:  # text JSON cannot hold (a lone surrogate): the older point stays
        return
    point = ResumePoint(
        run_id=state.run_id,
        model_step=answered.id,
        models_seen=mark.position,
        entries_seen=mark.entries_seen,
        waits_seen=mark.waits_seen,
        run_step=mark.run_step,
        thread_turn=state.thread_turn,
        messages=messages,
        usage=mark.usage,
    )
    # one INSERT ... ON CONFLICT DO UPDATE: `update_or_create` first read the run's older point
    # back (SELECT ... FOR UPDATE), its whole history with it, at every slice's end
    ResumePoint.objects.bulk_create(
        [point], update_conflicts=True, unique_fields=["run"], update_fields=POINT_FIELDS
    )
    state.resume_stored = True


def _startable(messages: list[Any]) -> bool:
    """A history a loop started without a prompt goes on from as the one that made it did: it
    ends in a request after an answer, with no prompt in it and no retry anywhere."""
    if len(messages) < 2 or not isinstance(messages[-1], ModelRequest):
        return False
    if not isinstance(messages[-2], ModelResponse):
        return False
    if any(isinstance(part, UserPromptPart) for part in messages[-1].parts):
        return False
    return not any(
        isinstance(part, RetryPromptPart)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def load(state: SliceState, point: ResumePoint | None) -> None:
    """`point`, the run's stored resume point, is where this slice starts if it still names the
    run's journal as it is (the model step it follows, succeeded)."""
    state.resume_stored = point is not None
    if point is None or not 0 < point.models_seen <= len(state.model_steps):
        return
    answered = state.model_steps[point.models_seen - 1]
    if answered.id != point.model_step or answered.status != StepStatus.SUCCEEDED:
        return
    state.resume = point
    state.models_seen, state.entries_seen = point.models_seen, point.entries_seen
    state.waits_seen, state.thread_turn = point.waits_seen, point.thread_turn


def history(point: ResumePoint) -> tuple[list[Any], RunUsage]:
    """The messages and usage a resumed slice's loop starts with."""
    own = str(point.run_id)
    messages = [
        replace(message, run_id=None) if getattr(message, "run_id", None) == own else message
        for message in ModelMessagesTypeAdapter.validate_json(point.messages)
    ]
    return messages, RUN_USAGE.validate_python(point.usage)


def forget(state: SliceState) -> None:
    """In the commit that ends the run: nothing resumes an ended run."""
    if state.resume_stored:
        ResumePoint.objects.filter(run_id=state.run_id).delete()
