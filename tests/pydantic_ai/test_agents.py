"""A Pydantic AI agent run by the engine, in process against PostgreSQL: each model request is a
model step whose deltas are the run's events, each tool call a tool step with its key; approvals
(with an edit, a rejection the model answers, two people) are decided in our inbox and continue
the same run; the permission snapshot narrows the tools the model is offered."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group

from agentruns.models import Run, RunEvent, RunStatus, Step, StepStatus, ToolPolicy, ToolRule
from agentruns.registry import current_step
from approvals import services
from approvals.errors import DecisionError
from approvals.models import Approval, ApprovalStatus
from tests.helpers import advance, assert_gapless, make_user, steps
from tests.pydantic_ai import agents  # noqa: F401  (registers the test agents)
from tests.pydantic_ai.kit import start

pytestmark = pytest.mark.django_db


def test_model_requests_and_tool_calls_are_steps_with_streamed_deltas():
    run = advance(start("pa-shop", ("pa_lookup", {"order_id": "ORD-7"}), say="Found it:"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    kinds = [(s.kind, s.tool, s.status) for s in steps(run)]
    assert kinds == [
        ("model", "", "succeeded"),
        ("tool", "pa_lookup", "succeeded"),
        ("model", "", "succeeded"),
    ]
    lookup = steps(run)[1]
    assert lookup.result == {"order_id": "ORD-7", "amount_cents": 4200}
    assert lookup.idempotency_key and lookup.call_id == "c0"
    deltas = RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
    assert "".join(e.data["text"] for e in deltas).startswith("Found it: pa_lookup=")
    assert run.output == "".join(e.data["text"] for e in deltas)
    assert run.model == "function:shop-script" and run.prompt_tokens > 0
    assert_gapless(run)


def test_tool_snapshot_keeps_each_tools_declared_semantics():
    run = start("pa-shop")
    assert run.tool_snapshot["pa_lookup"]["side_effect"] is False
    refund = run.tool_snapshot["pa_refund"]
    assert (refund["side_effect"], refund["idempotency"], refund["approval"]) == (
        True,
        "key",
        False,
    )
    credit = run.tool_snapshot["pa_credit"]
    assert credit["approval"] is True and credit["approvals"] == "predicate"
    assert credit["editable"]["amount_cents"]["rule"] == "at_most_requested"


def _parked(run: Run) -> Approval:
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.get(run=run, status=ApprovalStatus.PENDING)


def test_requires_approval_parks_and_an_edit_continues_the_same_run(django_user_model):
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = start("pa-shop", ("pa_credit", {"order_id": "ORD-9", "amount_cents": 5000}))
    approval = _parked(run)
    assert approval.requested_args == {"order_id": "ORD-9", "amount_cents": 5000}
    with pytest.raises(DecisionError):  # the edit policy: never more than requested
        services.approve(approval.id, user=approver, edited_args={"amount_cents": 6000})
    services.approve(approval.id, user=approver, edited_args={"amount_cents": 3000})
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    credit = Step.objects.get(run=run, tool="pa_credit")
    # the edit merged into the requested arguments (override_args would have replaced them)
    assert credit.arguments == {"order_id": "ORD-9", "amount_cents": 3000}
    assert credit.result == {
        "credited": 3000,
        "order_id": "ORD-9",
        "approved": True,  # RunContext.tool_call_approved
        "key": credit.idempotency_key,  # current_step()
    }
    assert "'credited': 3000" in run.output


def test_a_rejection_reaches_the_model_as_the_tools_denial(django_user_model):
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = start("pa-shop", ("pa_credit", {"order_id": "ORD-9", "amount_cents": 5000}), say="Sorry:")
    approval = _parked(run)
    services.reject(approval.id, user=approver, reason="credit limit reached")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="pa_credit").status == StepStatus.REJECTED
    assert run.output.strip() == "Sorry: pa_credit=credit limit reached"


def test_two_person_approval_from_the_tools_metadata(django_user_model):
    first = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    second = make_user(
        django_user_model, "approver2", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = start("pa-shop", ("pa_credit", {"order_id": "ORD-9", "amount_cents": 20_000}))
    approval = _parked(run)
    assert approval.approvals_required == 2
    services.approve(approval.id, user=first)
    assert advance(run).status == RunStatus.WAITING  # one of two: still parked
    services.approve(approval.id, user=second)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="pa_credit").result["credited"] == 20_000


def test_the_permission_snapshot_narrows_the_tools_offered(django_user_model):
    group = Group.objects.create(name="trainees")
    policy = ToolPolicy.objects.create(group=group, other_tools_allowed=True)
    ToolRule.objects.create(policy=policy, tool="pa_refund", allowed=False)
    trainee = make_user(django_user_model, "trainee", ["agentruns.start_run"])
    trainee.groups.add(group)
    run = start("pa-shop", ("pa_refund", {"order_id": "ORD-1", "amount_cents": 100}), user=trainee)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not Step.objects.filter(run=run, tool="pa_refund").exists()
    assert run.output.startswith("I may not use pa_refund.")


def test_a_call_outside_the_snapshot_is_refused_as_a_failed_step(django_user_model):
    group = Group.objects.create(name="trainees")
    policy = ToolPolicy.objects.create(group=group, other_tools_allowed=True)
    ToolRule.objects.create(policy=policy, tool="pa_refund", allowed=False)
    trainee = make_user(django_user_model, "trainee", ["agentruns.start_run"])
    trainee.groups.add(group)
    run = start(
        "pa-shop",
        ("pa_refund", {"order_id": "ORD-1", "amount_cents": 100}),
        user=trainee,
        call_unoffered=True,
    )
    run = advance(run)
    refused = Step.objects.get(run=run, tool="pa_refund")
    assert refused.status == StepStatus.FAILED and "not allowed" in refused.error
    assert refused.attempts == 0  # never called
    assert "pa_refund=" in run.output  # the model was told (a retry prompt)


def test_a_tool_raising_approval_required_parks_and_runs_approved(django_user_model):
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    small = advance(start("pa-shop", ("pa_discount", {"order_id": "ORD-2", "percent": 10})))
    assert small.status == RunStatus.SUCCEEDED, small.error
    assert Step.objects.get(run=small, tool="pa_discount").result["approved"] is False

    run = start("pa-shop", ("pa_discount", {"order_id": "ORD-2", "percent": 50}))
    approval = _parked(run)
    step = Step.objects.get(run=run, tool="pa_discount")
    assert step.status == StepStatus.WAITING_APPROVAL
    services.approve(approval.id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    step.refresh_from_db()
    assert step.result == {"order_id": "ORD-2", "percent": 50, "approved": True}
    assert step.idempotency_key == approval.step.idempotency_key  # the same call, asked once
    assert Approval.objects.filter(step=step).count() == 1


def test_model_retry_from_a_tool_goes_back_to_the_model():
    run = advance(start("pa-shop", ("pa_lookup", {"order_id": "ORD-0"}), say="Hm:"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert "pa_lookup=no such order; ask the customer again" in run.output


def test_current_step_outside_a_tool_call():
    with pytest.raises(LookupError):
        current_step()


def test_a_plain_function_tool_runs_on_the_executors_thread_in_its_transaction(monkeypatch):
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)  # as in production
    run = advance(start("pa-shop", ("pa_note", {"order_id": "ORD-3"})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    note = Step.objects.get(run=run, tool="pa_note")
    # not on a worker thread of pydantic-ai's: the same thread and connection as the engine,
    # inside the model step's commit (a transactional tool happens exactly once by atomicity)
    assert note.result == {"thread": threading.get_ident(), "in_transaction": True}
