"""A run acts only on what it was started for (issue 46, DESIGN.md 4.13): its agent's `scope` of
its input is frozen into the run at start, and a call whose tool declares `scope_arg` with
another value is refused when it is planned, before any approval rule: the model is told, the
run page shows the refused call, and no approval item is ever created.

In-process on the real PostgreSQL (`advance` runs a run's slices): the declarations on a native
agent, then the audit's reproduction on the demo's refund agent, whose thread's first message
was about another order."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import Agent, Edit, ToolContext, durable, register_agent, tool
from agentruns.registry.run_input.scopes import BadScope
from agentruns.services import fork_run, start_run
from approvals.models import Approval
from tests.helpers import ApiClient, advance, make_user
from tests.testkit import script_policy

pytestmark = pytest.mark.django_db

AGENT = "scoped-script"
PAID: list[dict] = []


@tool(side_effect=True, requires_approval=True, scope_arg="account")
def t_scoped_pay(ctx: ToolContext, account: str, amount: int) -> dict:
    """Pay into an account (always approved first); bound to the run's account."""
    PAID.append({"account": account, "amount": amount})
    return {"paid": amount, "account": account}


@tool(scope_arg="account")
def t_scoped_read(ctx: ToolContext, account: str) -> dict:
    """Read an account; bound to the run's account."""
    return {"account": account, "balance": 10}


register_agent(
    Agent(
        name=AGENT,
        instructions="Follow the script.",
        tools=["t_scoped_pay", "t_scoped_read", "t_echo"],
        scripted_policy=script_policy,
    ),
    scope=lambda run_input: run_input["account"],
)


def scripted(account: str, *turns: dict, user=None) -> Run:
    return start_run(AGENT, {"account": account, "script": list(turns)}, user=user).run


def tool_steps(run: Run) -> list[Step]:
    return list(Step.objects.filter(run=run, kind="tool").order_by("index"))


def test_the_scope_is_frozen_at_start_and_kept_by_a_fork(lead):
    run = scripted("ACC-1", {"text": "nothing to do"})
    assert run.scope == "ACC-1"
    assert run.tool_snapshot["t_scoped_pay"]["scope_arg"] == "account"
    assert run.tool_snapshot["t_echo"]["scope_arg"] is None
    assert advance(run).status == RunStatus.SUCCEEDED
    fork = fork_run(run.id, 0, user=lead)
    assert fork.scope == "ACC-1"


def test_a_call_outside_the_scope_is_refused_before_any_approval():
    PAID.clear()
    run = scripted(
        "ACC-1",
        {"calls": [["t_scoped_read", {"account": "ACC-2"}], ["t_echo", {"text": "ACC-2"}]]},
        {"calls": [["t_scoped_pay", {"account": "ACC-2", "amount": 500}]]},
        {"text": "gave up"},
    )
    assert advance(run).status == RunStatus.SUCCEEDED
    read, echo, pay = tool_steps(run)
    for refused in (read, pay):
        assert refused.status == StepStatus.FAILED and refused.attempts == 0
        assert "'ACC-2' is outside this run's scope" in refused.error
        assert "started for 'ACC-1'" in refused.error
    assert echo.status == StepStatus.SUCCEEDED  # a tool without scope_arg is not bound
    assert not Approval.objects.filter(step__run=run).exists()
    assert PAID == []
    # the model was told: the refusal is the tool's answer in the next turn's conversation
    model = Step.objects.filter(run=run, kind="model").order_by("index").last()
    assert model.text == "gave up"


def test_a_call_inside_the_scope_goes_on_to_its_approval():
    run = scripted("ACC-1", {"calls": [["t_scoped_pay", {"account": "ACC-1", "amount": 5}]]})
    assert advance(run).status == RunStatus.WAITING
    (pay,) = tool_steps(run)
    assert pay.status == StepStatus.WAITING_APPROVAL
    assert Approval.objects.get(step=pay).status == "pending"


def test_an_agent_that_declares_a_scope_binds_every_run():
    with pytest.raises(BadScope, match="KeyError"):
        start_run(AGENT, {"script": []})  # no account: no unbounded run either
    with pytest.raises(BadScope, match="string or an integer"):
        start_run(AGENT, {"account": ["ACC-1", "ACC-2"], "script": []})
    assert not Run.objects.exists()


def test_declarations_that_cannot_work_fail_at_start_up():
    with pytest.raises(ValueError, match="not one of its arguments"):
        tool(lambda ctx, account: {}, name="t_bad_scope", scope_arg="order")
    with pytest.raises(ValueError, match="may not be editable"):
        tool(
            lambda ctx, account, amount: {},
            name="t_bad_scope",
            scope_arg="account",
            editable={"account": Edit.free()},
        )
    with pytest.raises(TypeError, match="scope must be a function"):
        register_agent(Agent(name="bad-scope", instructions="", tools=["t_echo"]), scope="account")
    assert durable(scope_arg="order_id") == {"agentruns": {"scope_arg": "order_id"}}


# ------------------------------------------------------------------ the audit's reproduction
def test_a_run_for_one_order_never_puts_another_before_an_approver(seeded, django_user_model):
    """A thread whose first message was about ORD-1050 (its run looked the order up, asked for
    its refund and was stopped), then a run in it for ORD-1039: the model reads ORD-1050 in the
    history and asks to refund it; the call is refused before it is planned for approval, the
    run page shows it, and the inbox never gets a refund of ORD-1050 from that run."""
    lead = django_user_model.objects.get(username="lead")
    api = ApiClient(lead)
    first = api.post(
        "/api/threads/t-audit/messages",
        {"text": "My order arrived broken", "agent": "refund", "input": {"order_id": "ORD-1050"}},
    )
    assert first.status_code == 202, first.content
    earlier = Run.objects.get(id=first.json()["run_id"])
    assert advance(earlier).status == RunStatus.WAITING  # its own order's refund, for approval
    stopped = api.post(f"/api/runs/{earlier.id}/stop", {})
    assert stopped.status_code == 200, stopped.content
    assert not Approval.objects.filter(status="pending").exists()  # withdrawn with its run

    started = api.post(
        "/api/runs",
        {
            "agent": "refund",
            "thread": "t-audit",
            "input": {"order_id": "ORD-1039", "message": "The lamp arrived broken"},
        },
    )
    assert started.status_code == 201, started.content
    run = Run.objects.get(id=started.json()["id"])
    advance(run)
    assert run.status in (RunStatus.SUCCEEDED, RunStatus.WAITING), run.error

    # nothing this run asked an approver names another order
    asked = [a.step.arguments for a in Approval.objects.filter(step__run=run)]
    assert all(args.get("order_id") == "ORD-1039" for args in asked), asked
    assert not Approval.objects.filter(status="pending", step__arguments__order_id="ORD-1050")
    # what it acts on was frozen from its own input
    assert run.scope == "ORD-1039" and started.json()["scope"] == "ORD-1039"
    refunds = [s for s in tool_steps(run) if s.tool == "issue_refund"]
    assert [s.arguments["order_id"] for s in refunds] == ["ORD-1050"]  # what the history said
    (refund,) = refunds
    assert refund.status == StepStatus.FAILED and refund.attempts == 0
    assert "'ORD-1050' is outside this run's scope" in refund.error
    # the run page shows the refused call, and what the run acts on
    viewer = make_user(django_user_model, "looker", ["agentruns.view_run"])
    page = ApiClient(viewer).client
    page.force_login(viewer)
    html = page.get(f"/runs/{run.id}/").content.decode()
    assert "outside this run&#x27;s scope" in html and 'id="run-scope"' in html
