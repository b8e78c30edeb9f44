"""A resumed slice starts at the run's resume point, not at its start (runtime/engine/resume.py):
the agent's own code (its instructions function, its tools) runs only for what comes after the
point, and sees what the loop that was never cut would have shown it: the run's prompt and the
same step numbers."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, ProcessEventStream
from pydantic_ai.messages import FunctionToolCallEvent, ModelRequest, SystemPromptPart
from pydantic_ai.models.function import FunctionModel

from agentruns.models import ResumePoint, RunStatus, StepStatus
from agentruns.registry import register_agent
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.helpers import advance, make_user, steps
from tests.pydantic_ai.agents import play
from tests.pydantic_ai.kit import plan, start

pytestmark = pytest.mark.django_db(transaction=True)

# what the agent's own code saw, in order: ("instructions" | tool name, prompt, run step)
SEEN: list[tuple[str, object, int]] = []

resuming = Agent(FunctionModel(stream_function=play, model_name="resume-script"), name="pa-resume")


@resuming.instructions
def told(ctx: RunContext[None]) -> str:
    SEEN.append(("instructions", ctx.prompt, ctx.run_step))
    return "You help customers of the shop."


@resuming.tool
def rp_look(ctx: RunContext[None], order_id: str) -> dict:
    """Look an order up (read-only)."""
    SEEN.append(("rp_look", ctx.prompt, ctx.run_step))
    return {"order_id": order_id, "amount_cents": 4200}


@resuming.tool(requires_approval=True, metadata={"agentruns": {"side_effect": True}})
def rp_credit(ctx: RunContext[None], order_id: str, amount_cents: int) -> dict:
    """Credit the customer (a person approves it first)."""
    SEEN.append(("rp_credit", ctx.prompt, ctx.run_step))
    return {"credited": amount_cents, "approved": ctx.tool_call_approved}


CALLS = (
    ("rp_look", {"order_id": "ORD-1"}),
    ("rp_look", {"order_id": "ORD-2"}),
    ("rp_look", {"order_id": "ORD-3"}),
    ("rp_credit", {"order_id": "ORD-3", "amount_cents": 500}),
)


def like_resuming(name: str, prefix: str, *capabilities: AbstractCapability) -> tuple:
    """An agent of the same script and tools as `resuming` (their names prefixed), with
    `capabilities`, and its calls."""
    agent = Agent(
        FunctionModel(stream_function=play, model_name=name),
        name=f"pa-{name}",
        capabilities=list(capabilities),
    )
    agent.tool(name=f"{prefix}_look")(rp_look)
    agent.tool(
        name=f"{prefix}_credit",
        requires_approval=True,
        metadata={"agentruns": {"side_effect": True}},
    )(rp_credit)
    return agent, tuple((f"{prefix}_" + tool[3:], args) for tool, args in CALLS)


def parked_then_approved(django_user_model, agent: Agent, calls: tuple, seen: list) -> list:
    """Run `agent` through `calls` until it parks for the credit (its point stored), then, with
    `seen` cleared, approve the credit and run it to its end. What `seen` held at the park."""
    register_agent(agent)
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    seen.clear()
    run = advance(start(agent.name, *calls))
    assert run.status == RunStatus.WAITING, run.error
    assert ResumePoint.objects.filter(run=run).exists()
    at_the_park = list(seen)
    seen.clear()
    services.approve(Approval.objects.get(run=run, status=ApprovalStatus.PENDING).id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    return at_the_park


def test_a_run_resumed_after_an_approval_starts_at_its_point_and_sees_what_it_saw(
    django_user_model,
):
    register_agent(resuming)
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    prompt = plan(*CALLS)
    SEEN.clear()
    run = advance(start("pa-resume", *CALLS))
    assert run.status == RunStatus.WAITING, run.error
    first = list(SEEN)
    # a tool sees the step of the request that asked for it
    assert [(what, step) for what, _, step in first] == [
        ("instructions", 1),
        ("rp_look", 1),
        ("instructions", 2),
        ("rp_look", 2),
        ("instructions", 3),
        ("rp_look", 3),
        ("instructions", 4),
    ], first
    point = ResumePoint.objects.get(run=run)  # stored in the commit that parked the run
    assert point.models_seen == 3 and point.run_step == 3

    SEEN.clear()
    services.approve(Approval.objects.get(run=run, status=ApprovalStatus.PENDING).id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # only the request the point stands before (its answer recorded) and the one after it ran
    # the agent's code again: never the three lookups, and the same prompt and step numbers a
    # run never parked shows (its 4th request asked for the credit, its 5th ended it)
    assert SEEN == [
        ("instructions", prompt, 4),
        ("rp_credit", prompt, 4),
        ("instructions", prompt, 5),
    ], SEEN
    assert all(seen_prompt == prompt for _, seen_prompt, _ in first)
    assert not ResumePoint.objects.filter(run=run).exists()  # an ended run resumes nowhere
    done = steps(run)
    assert [s.tool for s in done if s.kind == "tool"] == [name for name, _ in CALLS]
    assert all(s.status == StepStatus.SUCCEEDED for s in done)
    assert run.output.startswith("Done.") and "rp_credit=" in run.output, run.output


def test_a_run_with_no_point_replays_from_its_start(django_user_model):
    """Without a point (here: removed), the next slice replays the whole run, as before."""
    register_agent(resuming)
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = advance(start("pa-resume", *CALLS))
    assert run.status == RunStatus.WAITING, run.error
    ResumePoint.objects.filter(run=run).delete()
    SEEN.clear()
    services.approve(Approval.objects.get(run=run, status=ApprovalStatus.PENDING).id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    instructions = [step for what, _, step in SEEN if what == "instructions"]
    assert instructions == [1, 2, 3, 4, 5]  # every request again (their answers recorded)
    assert [what for what, _, _ in SEEN if what != "instructions"] == ["rp_credit"]


# ---------------------------------------------------------------- a request's own copy of the history
NOTE = "(a note on this request only)"
NOTES: list[int] = []  # how many notes each request's history held before its own was added


@dataclass
class NoteTheRequest(AbstractCapability[None]):
    """Adds a note to the messages one request sends, not to the loop's history (as a
    capability that trims or annotates only what the model is sent does)."""

    async def before_model_request(self, ctx, request_context):
        messages = list(request_context.messages)
        NOTES.append(
            sum(
                1
                for message in messages
                if isinstance(message, ModelRequest)
                for part in message.parts
                if isinstance(part, SystemPromptPart) and part.content == NOTE
            )
        )
        first = messages[0]
        noted = [replace(first, parts=[*first.parts, SystemPromptPart(NOTE)]), *messages[1:]]
        request_context.messages = noted
        return request_context


noting, NOTED_CALLS = like_resuming("resume-noting", "rn", NoteTheRequest())


def test_a_resumed_loop_starts_from_its_own_history_not_a_requests_copy(django_user_model):
    """The point holds the loop's history (the run context's messages), not the copy a request
    sent the model: a note a capability put on one request only is not in the history a
    resumed loop starts from."""
    assert parked_then_approved(django_user_model, noting, NOTED_CALLS, NOTES) == [0, 0, 0, 0]
    assert NOTES == [0, 0], NOTES


# ---------------------------------------------------------------- an agent's event stream handler
WATCHED: list[str] = []  # the tool calls the handler saw, by name


async def watched_events(ctx: RunContext[None], events) -> None:
    async for event in events:
        if isinstance(event, FunctionToolCallEvent):
            WATCHED.append(event.part.tool_name)


watched, WATCHED_CALLS = like_resuming("resume-watched", "rw", ProcessEventStream(watched_events))


def test_a_resumed_loop_hands_its_events_to_the_agents_event_stream_handler(django_user_model):
    """Driven node by node from its point, the loop streams each node to the agent's
    `ProcessEventStream` as `agent.run()` does: the handler sees the approved call."""
    parked_then_approved(django_user_model, watched, WATCHED_CALLS, WATCHED)
    assert WATCHED == ["rw_credit"], WATCHED
