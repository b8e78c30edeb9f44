"""Questions to a colleague (issue 33, item 2): the agent calls `ask_human` (from `wait_tools()`),
the run parks with an inbox item of kind `question`, a person answers (the inbox, the API), and
the model reads the answer as the call's result on its next turn. In-process on the real engine
against PostgreSQL."""

from __future__ import annotations

import json

import pytest

from agentruns.models import RunStatus, StepStatus, Wait, WaitKind, WaitStatus
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.approvals import question_agent
from tests.helpers import advance, events, make_user, steps
from tests.pydantic_ai.kit import start

pytestmark = pytest.mark.django_db

QUESTION = "Is order ORD-7 eligible under the new 60-day policy?"
DECIDER = ["approvals.decide_approval", "approvals.view_approval"]


def asked(question: str = QUESTION, choices: list[str] | None = None, **extra):
    args = {"question": question, **({"choices": choices} if choices is not None else {})}
    question_agent.SEEN.clear()
    return advance(start("pa-asker", ("ask_human", args), say="Colleague said:", **extra))


def test_the_answer_is_the_result_the_model_reads_and_the_run_goes_on(django_user_model):
    run = asked()
    assert run.status == RunStatus.WAITING, run.error
    item = Approval.objects.get(run=run)
    assert (item.kind, item.status, item.tool) == ("question", "pending", "ask_human")
    assert (item.question, item.choices) == (QUESTION, None)
    wait = Wait.objects.get(run=run)
    assert (wait.kind, wait.status, wait.token) == (WaitKind.QUESTION, "pending", item.wait_token)
    assert question_agent.SEEN == []  # nothing answered yet

    colleague = make_user(django_user_model, "colleague", DECIDER)
    services.answer(item.id, user=colleague, answer="Yes, it is eligible")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED  # the wait's compare-and-set queued it, once
    assert Wait.objects.get(run=run).status == WaitStatus.RESOLVED
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", "Yes, it is eligible")]
    assert run.output.startswith("Colleague said: ask_human=Yes, it is eligible")
    ask = next(s for s in steps(run, "tool") if s.tool == "ask_human")
    assert (ask.status, ask.result) == (StepStatus.SUCCEEDED, "Yes, it is eligible")
    decided = events(run, "approval.decided")[-1].data
    assert (decided["decision"], decided["by"], decided["answer"]) == (
        "answered",
        "colleague",
        "Yes, it is eligible",
    )
    item.refresh_from_db()
    assert (item.status, item.resolution, item.answer) == (
        "resolved",
        "answered",
        "Yes, it is eligible",
    )
