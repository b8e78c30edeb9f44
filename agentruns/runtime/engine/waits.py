"""Waits by token, the engine side (DESIGN.md 4.12): what the agent's loop waits for, journaled
as `Wait` rows, found again by their order in the run.

`StepWaiter` is the run's `ExternalEventWaiter` (installed for every slice): a new wait creates a
token, calls `ask(token)` once and records what it returned; unless `ask` answered, the run
parks (status waiting: no thread, no connection, nothing polling it). A replayed wait returns
the payload it was resolved with, raises `ExternalEventError` when it failed or timed out, and
parks again while nobody resolved it (no second token, no second `ask`). `resolve_wait` and
`fail_wait` resolve a token from any process, once: a compare-and-set that queues the run; a
second resolution changes nothing and says who resolved it first (`WaitAlreadyResolved`).
`fail_due_waits` (the sweeper) fails the waits past their timeout.

Deferred tool calls (`decide_deferred`, our durability's `handle_deferred_tool_calls`): calls
whose approval rule holds wait on the inbox (a wait of kind `approval`: each call's step
`waiting_approval` with its inbox item; decided when every item is, by the steps the decisions
changed); calls whose result comes from outside (`CallDeferred`, an `ExternalToolset`) wait on
a token of kind `event` whose payload is the `DeferredToolResults` (JSON), unless another
capability of the run (a user's `RequestInput`) answers them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic import JsonValue, TypeAdapter
from pydantic_ai.capabilities import RequestInput
from pydantic_ai.capabilities.abstract import leaf_capabilities
from pydantic_ai.durable_exec import ExternalEventError, ExternalEventWaiter, record_durable_unit
from pydantic_ai.external_events import wait_for_external_event
from pydantic_ai.messages import ModelRequest, RetryPromptPart, ToolReturnPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied

from agentruns.models import Step, StepStatus, Wait, WaitKind, WaitStatus
from agentruns.models.journal import TOOL_WAIT
from agentruns.runtime import writer
from agentruns.runtime.engine import journal
from agentruns.runtime.engine.journal import Parked, Yielded
from agentruns.runtime.engine.plan import stage
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.engine.tools import questions
from agentruns.runtime.events import EventType, step_event_data, succeeded_event_data
from agentruns.runtime.execution.transitions import approval_results
from agentruns.runtime.inbox import inbox
from agentruns.runtime.values.text import storable_text

RESULTS = TypeAdapter(DeferredToolResults)


class StepWaiter(ExternalEventWaiter):
    def __init__(self, state: SliceState) -> None:
        self.state = state

    async def wait(
        self,
        name: str,
        *,
        ask: Callable[[str], Awaitable[JsonValue]],
        timeout: timedelta | None,
    ) -> JsonValue:
        state = self.state
        found = _next_wait(state)
        if found is not None:
            return await _replayed(state, found)
        due = timezone.now() + timeout if timeout is not None else None
        wait = state.new_wait(name, WaitKind.EVENT, due_at=due)
        token = wait.token
        state.waits_seen += 1
        await journal.check(state, model=False)
        await state.lane.run(_journal_token, state, wait)
        asked = await ask(token)
        if asked is not None:  # answered in place: recorded as resolved by `ask`
            wait.status, wait.payload, wait.asked = WaitStatus.RESOLVED, asked, asked
            wait.resolved_by, wait.resolved_at = "ask", timezone.now()
            await state.lane.run(_save_answered, wait)
            record_durable_unit(executed=True)
            return asked
        raise SliceEnds(await state.lane.run(_parked_on, state, wait))


def _journal_token(state: SliceState, wait: Wait) -> None:
    """The token is journaled before anybody can resolve it."""
    with transaction.atomic():
        writer.save_wait(wait)
        journal.commit(state, [])


def _save_answered(wait: Wait) -> None:
    with transaction.atomic():
        writer.save_wait(wait, ["status", "payload", "asked", "resolved_by", "resolved_at"])


def _next_wait(state: SliceState) -> Wait | None:
    """The next wait of the run in order (an approval our rule asked for is found by its call
    instead: `rule_wait`; a question by its step: questions.py)."""
    while state.waits_seen < len(state.waits):
        wait = state.waits[state.waits_seen]
        state.waits_seen += 1
        if (
            wait.name != RULE_WAIT
            and not wait.name.startswith(TOOL_WAIT)
            and not questions.is_question_wait(wait)
        ):
            return wait
    return None


# ------------------------------------------------------------------ our approval rules
# the name of a wait our approval rule opened for one call (found by its call, not its order)
RULE_WAIT = "approval"


def rule_wait(state: SliceState, call_id: str) -> Wait | None:
    return next(
        (w for w in state.waits if w.name == RULE_WAIT and call_id in (w.calls or ())), None
    )


async def ask_for(state: SliceState, step: Step) -> SliceEnds:
    """An approval rule holds for this call: it waits in the inbox and the slice ends here, so
    nothing after it in the turn runs before a person decided (as a side effect's order
    requires); the next slice makes the call as decided (`rule_decided`), then goes on."""
    await journal.check(state, model=False)
    return await _open_in_inbox(state, [step], name=RULE_WAIT)


async def rule_decided(state: SliceState, step: Step) -> bool:
    """The call's rule wait is decided (approved: its arguments as approved; rejected or
    expired: its unit answers with the reason); False: it still waits (the run parks)."""
    if step.status != StepStatus.WAITING_APPROVAL:
        return True
    raise await journal.ended(state, Parked())


async def _replayed(state: SliceState, wait: Wait) -> JsonValue:
    if wait.status == WaitStatus.RESOLVED:
        record_durable_unit(executed=False)
        return wait.payload
    if wait.status == WaitStatus.FAILED:
        record_durable_unit(executed=False)
        raise ExternalEventError(wait.error or "the wait failed")
    if wait.asked is not None:
        record_durable_unit(executed=False)
        return wait.asked
    raise await journal.ended(state, Parked())  # still nobody


def _parked_on(state: SliceState, wait: Wait) -> str:
    """On the lane: the run waits for `wait`, unless it was resolved while `ask` ran (then it
    goes on at once: queued, its next slice finds the resolution)."""
    with transaction.atomic():
        current = Wait.objects.select_for_update().get(id=wait.id)
        if current.status != WaitStatus.PENDING:
            return journal.end(state, Yielded("resolved while asking"))
        return journal.park(state)


# ------------------------------------------------------------------ deferred tool calls
def _others_answer(ctx: Any) -> bool:
    """Another capability of the run answers deferred calls (a user's `RequestInput`)."""
    root = getattr(ctx, "root_capability", None)
    return root is not None and any(isinstance(c, RequestInput) for c in leaf_capabilities(root))


async def decide_deferred(
    state: SliceState, ctx: Any, requests: DeferredToolRequests
) -> DeferredToolResults | None:
    decided: DeferredToolResults | None = None
    if requests.approvals:
        decided = await _approvals(state, requests)
    asked = questions.question_calls(requests)
    if asked:  # a person answers in the inbox (parks until every question is answered)
        answered = DeferredToolResults(calls=await questions.answers(state, requests, asked))
        _record_external(state, DeferredToolRequests(calls=asked), answered)
        decided = answered if decided is None else _merged(decided, answered)
    others = [call for call in requests.calls if call not in asked]
    if others and not _others_answer(ctx):
        remaining = DeferredToolRequests(calls=others, metadata=requests.metadata)
        payload = await wait_for_external_event("deferred_tool_calls", ask=lambda token: None)
        results = RESULTS.validate_python(payload)
        _record_external(state, remaining, results)
        external = remaining.build_results(calls=results.calls, metadata=results.metadata)
        decided = external if decided is None else _merged(decided, external)
    return decided


def _merged(first: DeferredToolResults, second: DeferredToolResults) -> DeferredToolResults:
    return DeferredToolResults(
        calls={**first.calls, **second.calls},
        approvals={**first.approvals, **second.approvals},
        metadata={**first.metadata, **second.metadata},
    )


async def _approvals(state: SliceState, requests: DeferredToolRequests) -> DeferredToolResults:
    calls = [call.tool_call_id for call in requests.approvals]
    found = _next_wait(state)
    if found is not None:
        steps = [state.step_for_call(call_id) for call_id in calls]
        if any(s is None or s.status == StepStatus.WAITING_APPROVAL for s in steps):
            raise await journal.ended(state, Parked())
        record_durable_unit(executed=False)
        payload = found.payload if found.status == WaitStatus.RESOLVED else None
        return RESULTS.validate_python(payload or approval_results(steps))
    await journal.check(state, model=False)
    return await _ask_the_inbox(state, requests, calls)


async def _ask_the_inbox(
    state: SliceState, requests: DeferredToolRequests, calls: list[str]
) -> DeferredToolResults:
    """Each call's step waits in the inbox; the run parks until every item is decided."""
    denied: dict[str, ToolDenied] = {}
    waiting: list[Step] = []
    for call_id in calls:
        step = state.step_for_call(call_id)
        if step is None:  # not a call the engine planned: nobody could decide it
            denied[call_id] = ToolDenied("this call cannot be approved here")
            continue
        waiting.append(step)
    if not waiting:
        return requests.build_results(approvals=denied)
    raise await _open_in_inbox(state, waiting, name="approvals")


async def _open_in_inbox(state: SliceState, waiting: list[Step], *, name: str) -> SliceEnds:
    """`waiting` calls' steps wait in the inbox, each with its item, under one approval wait;
    the run parks (its last commit, with the items and the wait)."""
    for step in waiting:
        step.status = StepStatus.WAITING_APPROVAL
        stage(state.pending.batch, step, ["status"])
    wait = state.new_wait(name, WaitKind.APPROVAL, calls=[s.call_id for s in waiting])
    if name != RULE_WAIT:
        state.waits_seen += 1
    return SliceEnds(await state.lane.run(_opened_in_inbox, state, waiting, wait))


def _opened_in_inbox(state: SliceState, waiting: list[Step], wait: Wait) -> str:
    agent = state.run.agent
    events: list = []
    with transaction.atomic():
        for step in waiting:
            approval_id = inbox().open_approval(step, agent)
            events.append((EventType.STEP_WAITING_APPROVAL, step_event_data(step, error="")))
            events.append(
                (
                    EventType.APPROVAL_REQUESTED,
                    {
                        "step": step.index,
                        "approval": approval_id,
                        "kind": "approval",
                        "tool": step.tool,
                    },
                )
            )
        writer.save_wait(wait)
        return journal.park(state, events_before=events)


def _record_external(
    state: SliceState, requests: DeferredToolRequests, results: DeferredToolResults
) -> None:
    """An outside result of a deferred call is its step's result (the model gets it as the
    tool's answer)."""
    now = timezone.now()
    for call in requests.calls:
        step = state.step_for_call(call.tool_call_id)
        value = results.calls.get(call.tool_call_id)
        if step is None or step.is_terminal or value is None:
            continue
        step.status, step.finished_at = StepStatus.SUCCEEDED, now
        step.result = value if isinstance(value, dict | list | str | int | float) else str(value)
        stage(state.pending.batch, step, ["status", "result", "finished_at"])
        state.pending.events.append(
            (EventType.STEP_SUCCEEDED, succeeded_event_data(state.run, step))
        )


def record_answered_elsewhere(state: SliceState, messages: Any) -> None:
    """Before the next model request: a deferred call another capability answered (a user's
    `RequestInput`) reaches the model as a tool return or retry prompt without its unit ever
    running; its step records that answer, so it does not stay pending."""
    if not messages or not isinstance(messages[-1], ModelRequest):
        return
    now = timezone.now()
    for part in messages[-1].parts:
        if not isinstance(part, ToolReturnPart | RetryPromptPart):
            continue
        step = state.step_for_call(part.tool_call_id)
        if step is None or step.is_terminal or step.attempts:
            continue
        step.finished_at = now
        if isinstance(part, ToolReturnPart) and getattr(part, "outcome", "success") == "success":
            content = part.content
            step.status = StepStatus.SUCCEEDED
            step.result = (
                content if isinstance(content, dict | list | str | int | float) else str(content)
            )
            event = (EventType.STEP_SUCCEEDED, succeeded_event_data(state.run, step))
            stage(state.pending.batch, step, ["status", "result", "finished_at"])
        else:  # failed, denied or a retry prompt: the call's error, as the model read it
            said = part.model_response_str() if isinstance(part, ToolReturnPart) else None
            step.status = StepStatus.FAILED
            step.error = storable_text(said or part.model_response())
            event = (EventType.STEP_FAILED, step_event_data(step))
            stage(state.pending.batch, step, ["status", "error", "finished_at"])
        state.pending.events.append(event)
