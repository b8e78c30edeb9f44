"""Waits by token, the engine side (issue 32 item 4), through Pydantic AI's public API: a tool's
result that comes from outside (`CallDeferred`) answered through `RequestInput`, whose `ask`
hands the resume token on. The run parks (waiting: no thread, no connection); resolving the
token from anywhere resumes it once; a second resolution changes nothing and says who resolved
it first; a timeout resumes the wait with `ExternalEventError`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic_ai import Agent, CallDeferred
from pydantic_ai.capabilities import RequestInput
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.models import Run, RunStatus, Wait, WaitStatus
from agentruns.registry import register_agent
from agentruns.runtime.execution.transitions import UnknownToken, WaitAlreadyResolved, resolve_wait
from agentruns.runtime.waits.due import fire_due_waits
from agentruns.services import start_run
from tests.helpers import advance, assert_gapless, fire_due_waits_at, steps

pytestmark = pytest.mark.django_db

HANDED: list[str] = []  # the tokens `ask` handed on (to a carrier's webhook, a queue, a person)
MODEL_SAW: list[str] = []


def carrier_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answered = [
        p
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart | RetryPromptPart)
    ]
    if not answered:
        tool = info.function_tools[0].name
        return ModelResponse(parts=[ToolCallPart(tool, {"order_id": "ORD-5"}, "c1")])
    said = answered[-1].content
    said = said if isinstance(said, str) else str(said)
    MODEL_SAW.append(said)
    return ModelResponse(parts=[TextPart(f"The carrier says: {said}")])


def hand_on(ctx, requests, token: str) -> None:
    HANDED.append(token)
    return None  # answered later, by whoever holds the token


def _agent(name: str, timeout: timedelta | None) -> None:
    agent = Agent(
        FunctionModel(carrier_model, model_name=f"{name}-script"),  # cannot stream: asked whole
        name=name,
        instructions="Tell the customer where the parcel is.",
        capabilities=[RequestInput(ask=hand_on, name="carrier", timeout=timeout)],
    )

    @agent.tool_plain(name=f"{name.replace('-', '_')}_delivery_status")
    def delivery_status(order_id: str) -> str:
        """The carrier's answer arrives later, by webhook."""
        raise CallDeferred()

    register_agent(agent)


_agent("pa-carrier", None)
_agent("pa-carrier-timeout", timedelta(seconds=30))


def _parked(agent: str) -> tuple[Run, Wait]:
    HANDED.clear()
    MODEL_SAW.clear()
    run = advance(start_run(agent, {"message": "Where is ORD-5?"}).run)
    assert run.status == RunStatus.WAITING, run.error
    assert run.lease_owner in (None, "")  # no worker holds it while it waits
    wait = Wait.objects.get(run=run)
    assert HANDED == [wait.token] and wait.status == WaitStatus.PENDING
    return run, wait


def test_a_resolved_token_resumes_the_run_once_with_the_payload():
    run, wait = _parked("pa-carrier")
    payload = {"calls": {"c1": "delivered to the neighbour"}}
    resolve_wait(wait.token, payload, by="carrier-webhook")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert MODEL_SAW == ["delivered to the neighbour"]
    assert run.output == "The carrier says: delivered to the neighbour"
    assert HANDED == [wait.token]  # the replay did not ask again
    tool = steps(run, "tool")[0]
    assert tool.result == "delivered to the neighbour"
    with pytest.raises(WaitAlreadyResolved, match="carrier-webhook"):
        resolve_wait(wait.token, {"calls": {"c1": "lost"}}, by="someone-else")
    assert Wait.objects.get(id=wait.id).payload == payload
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED
    assert_gapless(run)


def test_an_unknown_token_is_refused():
    with pytest.raises(UnknownToken):
        resolve_wait("no-such-token", {})


def test_a_timeout_resumes_the_wait_with_an_external_event_error():
    run, wait = _parked("pa-carrier-timeout")
    assert wait.due_at is not None
    assert fire_due_waits() == 0  # not due yet
    assert fire_due_waits_at(wait.due_at + timedelta(seconds=1)) == 1
    wait.refresh_from_db()
    assert wait.status == WaitStatus.FAILED and wait.resolved_by == "timeout"
    run = advance(run)
    # RequestInput turns the ExternalEventError into the call's failure, which the model reads
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(MODEL_SAW) == 1 and "No resolution arrived" in MODEL_SAW[0]
    tool = steps(run, "tool")[0]
    assert tool.status == "failed" and "No resolution arrived" in tool.error
    assert HANDED == [wait.token]
