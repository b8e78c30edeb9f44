"""Questions a run asks a person: deferred calls of Pydantic AI's kind `question`
(`agentruns.registry.wait_tools()`'s `ask_human`, Pydantic AI Harness's `AskUser`, any tool that
raises `CallDeferred(kind="question")`).

Each question waits on a `Wait` of kind `question` with an inbox item of kind `question` (the
question, its choices, the token its answer resolves), opened in the commit that parks the run.
A question's wait is found again by its call's step (`calls` holds the step's id), not by its
order, because once answered its call's step is replayed as succeeded and never asks again.
The answer (`{"answer": text}`, resolved once by `transitions.resolve_wait`) is the call's
result, which the model reads on its next turn. Questions are asked before a user's
`RequestInput` capability sees the deferred calls: they always land in the inbox.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import DeferredToolRequests

from agentruns.models import Step, Wait, WaitKind, WaitStatus
from agentruns.runtime import writer
from agentruns.runtime.engine import journal
from agentruns.runtime.engine.journal import Parked
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import EventType
from agentruns.runtime.inbox import inbox

QUESTION_WAIT = "question"
MAX_QUESTION = 2000
MAX_CHOICES = 10


def question_calls(requests: DeferredToolRequests) -> list[ToolCallPart]:
    return [c for c in requests.calls if requests.kind(c.tool_call_id) == "question"]


def is_question_wait(wait: Wait) -> bool:
    return wait.kind == WaitKind.QUESTION


def _wait_of(state: SliceState, step: Step) -> Wait | None:
    key = str(step.id)
    return next((w for w in state.waits if is_question_wait(w) and key in (w.calls or ())), None)


async def answers(
    state: SliceState, requests: DeferredToolRequests, calls: list[ToolCallPart]
) -> dict[str, Any]:
    """Each question's answer by call id, once every one of them is answered; until then the
    questions not asked yet go to the inbox and the run parks (raises the slice's end)."""
    found: dict[str, Any] = {}
    unasked: list[tuple[ToolCallPart, Step]] = []
    waiting = False
    for call in calls:
        step = state.step_for_call(call.tool_call_id)
        if step is None:  # not a call the engine planned: nobody could answer it
            found[call.tool_call_id] = ToolFailed("this question cannot be asked here")
            continue
        wait = _wait_of(state, step)
        if wait is None:
            unasked.append((call, step))
        elif wait.status == WaitStatus.RESOLVED:
            payload = wait.payload if isinstance(wait.payload, dict) else {}
            found[call.tool_call_id] = str(payload.get("answer", ""))
        elif wait.status == WaitStatus.FAILED:
            found[call.tool_call_id] = ToolFailed(wait.error or "the question was not answered")
        else:
            waiting = True
    if unasked:
        await journal.check(state, model=False)
        raise await _ask(state, requests, unasked)
    if waiting:
        raise await journal.ended(state, Parked())
    return found


def question_of(call: ToolCallPart, metadata: dict | None) -> tuple[str, list[str] | None]:
    """The question and its choices as the call's metadata gives them (a question deferred
    without one: the call itself, so a person still sees what is asked)."""
    meta = metadata if isinstance(metadata, dict) else {}
    question = meta.get("question")
    if not isinstance(question, str) or not question.strip():
        question = f"{call.tool_name}({call.args_as_json_str()})"
    choices = meta.get("choices")
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        kept: list[str] | None = list(dict.fromkeys(choices))[:MAX_CHOICES]
    else:
        kept = None
    return question.strip()[:MAX_QUESTION], kept


async def _ask(
    state: SliceState, requests: DeferredToolRequests, unasked: list[tuple[ToolCallPart, Step]]
) -> SliceEnds:
    """The questions not asked yet: each a wait and an inbox item, in the commit that parks the
    run (so an item is never without its wait, nor a parked run without its items)."""
    asked: list[tuple[Wait, Step, str, list[str] | None]] = []
    for call, step in unasked:
        question, choices = question_of(call, requests.metadata.get(call.tool_call_id))
        # found by its step, never by its order: not "seen"
        wait = state.new_wait(QUESTION_WAIT, WaitKind.QUESTION, calls=[str(step.id)])
        asked.append((wait, step, question, choices))
    return SliceEnds(await state.lane.run(_asked, state, asked))


def _asked(state: SliceState, asked: list[tuple[Wait, Step, str, list[str] | None]]) -> str:
    events: list = []
    agent = state.run.agent
    with transaction.atomic():
        for wait, step, question, choices in asked:
            writer.save_wait(wait)
            item = inbox().open_question(
                step, agent, token=wait.token, question=question, choices=choices
            )
            data = {
                "step": step.index,
                "approval": item,
                "kind": "question",
                "tool": step.tool,
                "question": question,
                "choices": choices,
            }
            events.append((EventType.APPROVAL_REQUESTED, data))
        return journal.park(state, events_before=events)
