"""A resumed slice starts at the run's resume point, not at its start (runtime/engine/resume.py):
the agent's own code (its instructions function, its tools) runs only for what comes after the
point, and sees what the loop that was never cut would have shown it: the run's prompt and the
same step numbers."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, RunContext
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
