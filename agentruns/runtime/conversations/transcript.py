"""A run's own transcript read from its steps, and what a thread's run that ends without an
answer leaves in its thread (issue 33: an interrupt keeps the completed tool steps, and the next
turn's model reads them).

A model step's result is the ModelResponse it recorded (`recorded`: what a replay returns); a
tool step's result is its call's answer. A thread's run that is cancelled (an interrupt, a stop)
stores, in the commit that ends it and so before the next turn can begin, its responses and the
answers of the calls that ran (`record_unanswered`): a cut turn's text so far, the refund that
went out before the stop, the customer's reply to a question the run had not read yet. A call
that never ran is left out with its request, so the next model does not read that it happened.
A failed run stores nothing here: it may be retried, and its answer is appended when the retry
succeeds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from pydantic_ai.durable_exec import JSON_CODEC
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.usage import RequestUsage

from agentruns.models import Step, StepKind, StepStatus, Wait, WaitKind, WaitStatus
from agentruns.models.journal import TOOL_WAIT
from agentruns.runtime.conversations import history

ANSWERED = (StepStatus.SUCCEEDED, StepStatus.FAILED)


def recorded(step: Step) -> Any:
    """What a succeeded model step returns on replay (the JSON codec's form): its `payload`, the
    ModelResponse; a step of the engine before this one: rebuilt from its text and calls."""
    if step.payload is not None:
        return orjson.loads(step.payload)
    parts: list[Any] = [TextPart(step.text)] if step.text else []
    for call in step.tool_calls or []:
        parts.append(ToolCallPart(call["name"], call["arguments"], tool_call_id=call["id"]))
    usage = RequestUsage(input_tokens=step.prompt_tokens, output_tokens=step.completion_tokens)
    return JSON_CODEC.dump(ModelResponse, ModelResponse(parts=parts, usage=usage))


def _answer(step: Step, call: ToolCallPart, replies: dict[str, dict]) -> ToolReturnPart:
    if step.status == StepStatus.SUCCEEDED:
        said = step.result
    elif step.status == StepStatus.FAILED:
        said = f"error: {step.error}"
    else:  # cut after the customer's reply reached it: the reply, as `ask_customer` returns it
        reply = replies[str(step.id)]
        said = {"reply": reply.get("text", ""), "from": reply.get("author", "customer")}
    return ToolReturnPart(call.tool_name, said, tool_call_id=call.tool_call_id)


def _answered(step: Step, replies: dict[str, dict]) -> bool:
    return step.status in ANSWERED or str(step.id) in replies


def _turn(model: Step, tools: dict[str, Step], replies: dict[str, dict]) -> list[ModelMessage]:
    """A model step's response with the calls that were answered, then their answers."""
    response = JSON_CODEC.load(ModelResponse, recorded(model))
    answers = [
        _answer(tools[part.tool_call_id], part, replies)
        for part in response.parts
        if isinstance(part, ToolCallPart)
        and part.tool_call_id in tools
        and _answered(tools[part.tool_call_id], replies)
    ]
    answered = {a.tool_call_id for a in answers}
    parts: list[ModelResponsePart] = [
        p for p in response.parts if not isinstance(p, ToolCallPart) or p.tool_call_id in answered
    ]
    said: list[ModelMessage] = [replace(response, parts=parts)] if parts else []
    return [*said, ModelRequest(parts=list(answers))] if answers else said


def messages_of(steps: list[Step], replies: dict[str, dict] | None = None) -> list[ModelMessage]:
    """What the run's model said and its tools answered, in step order. `replies`: the
    customer's messages that answered a call still pending (by its step id)."""
    turns: list[tuple[Step, dict[str, Step]]] = []
    for step in sorted(steps, key=lambda s: s.index):
        if step.kind == StepKind.MODEL:
            turns.append((step, {}))
        elif turns and step.call_id:
            turns[-1][1][step.call_id] = step
    said: list[ModelMessage] = []
    for model, tools in turns:
        if model.status == StepStatus.SUCCEEDED:
            said += _turn(model, tools, replies or {})
    return said


def record_unanswered(run_id: Any, thread_id: str | None, steps: list[Step] | None = None) -> None:
    """A thread's run is cancelled (inside the transaction that ends it): what it did goes to
    its thread, once. `steps`: the run's steps as they end (read when not given)."""
    if thread_id is None:
        return
    if steps is None:
        steps = list(Step.objects.filter(run_id=run_id))
    said = messages_of(steps, _replies_taken(run_id))
    if said:
        history.record_messages(run_id, thread_id, said)


def _replies_taken(run_id: Any) -> dict[str, dict]:
    """The thread's messages that answered the run's calls waiting for one (by step id): a run
    stopped after the reply came and before it resumed still hands the reply to the next turn
    (the customer said it; the thread shows it)."""
    waits = Wait.objects.filter(
        run_id=run_id, kind=WaitKind.MESSAGE, status=WaitStatus.RESOLVED, name__startswith=TOOL_WAIT
    )
    replies: dict[str, dict] = {}
    for wait in waits.order_by("ordinal"):
        if isinstance(wait.payload, dict):  # a call's last reply is what it would go on with
            replies[wait.name.removeprefix(TOOL_WAIT)] = wait.payload
    return replies
