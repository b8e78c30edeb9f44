"""Questions to a colleague (issue 33, item 2): the agent calls `ask_human` (from `wait_tools()`),
the run parks with an inbox item of kind `question`, a person answers (the inbox, the API), and
the model reads the answer as the call's result on its next turn. In-process on the real engine
against PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentruns import services as run_services
from agentruns.models import Run, RunStatus, StepStatus, Wait, WaitKind, WaitStatus
from approvals import services
from approvals.domain import claims, escalation
from approvals.models import Approval, ApprovalStatus, WebhookDelivery, WebhookEndpoint
from tests.approvals import question_agent
from tests.helpers import ApiClient, advance, assert_json_error, events, make_user, steps
from tests.pydantic_ai.kit import start

pytestmark = pytest.mark.django_db

QUESTION = "Is order ORD-7 eligible under the new 60-day policy?"
HX = {"HTTP_HX_REQUEST": "true"}
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


def test_the_api_answers_with_a_choice(django_user_model):
    run = asked(choices=["eligible", "not eligible", "eligible"])  # a repeated choice once
    item = Approval.objects.get(run=run)
    assert item.choices == ["eligible", "not eligible"]
    api = ApiClient(make_user(django_user_model, "colleague", DECIDER))
    url = f"/api/approvals/{item.id}"

    listed = api.get("/api/approvals?kind=question").json()["approvals"]
    assert [(a["id"], a["question"], a["choices"], a["answer"]) for a in listed] == [
        (item.id, QUESTION, ["eligible", "not eligible"], None)
    ]
    empty = assert_json_error(api.post(url, {"decision": "answer", "answer": "  "}), 400)
    assert empty["code"] == "answer_required" and empty["fields"] == ["answer"]
    assert_json_error(api.post(url, {"decision": "approve"}), 422)  # not an approval
    assert Approval.objects.get(id=item.id).status == ApprovalStatus.PENDING  # nothing changed
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING

    done = api.post(url, {"decision": "answer", "answer": "not eligible"})
    assert done.status_code == 200, done.content
    body = done.json()
    assert (body["status"], body["resolution"], body["answer"], body["decided_by"]) == (
        "resolved",
        "answered",
        "not eligible",
        "colleague",
    )
    other = ApiClient(make_user(django_user_model, "other", DECIDER))
    late = assert_json_error(other.post(url, {"decision": "answer", "answer": "eligible"}), 409)
    assert late["decided_by"] == "colleague" and "answered" in late["error"]
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", "not eligible")]  # the first answer, once


def test_free_text_answers_a_question_with_choices(django_user_model):
    """DESIGN 6: free text is always accepted; the choices are what the card offers first."""
    run = asked(choices=["eligible", "not eligible"])
    item = Approval.objects.get(run=run)
    api = ApiClient(make_user(django_user_model, "colleague", DECIDER))
    answer = "eligible if the receipt is from this year"
    done = api.post(f"/api/approvals/{item.id}", {"decision": "answer", "answer": answer})
    assert done.status_code == 200, done.content
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", answer)]
    client = Client()
    client.force_login(make_user(django_user_model, "lead2", DECIDER))
    second = asked(choices=["yes", "no"])
    page = client.get("/approvals/").content.decode()
    card = page[page.index(f'id="approval-{Approval.objects.get(run=second).id}"') :]
    assert 'value="yes"' in card and "Another answer" in card  # buttons and a text box


def test_viewers_see_the_question_but_may_not_answer(django_user_model):
    run = asked()
    item = Approval.objects.get(run=run)
    viewer = make_user(django_user_model, "viewer", ["approvals.view_approval"])
    api = ApiClient(viewer)
    assert api.get(f"/api/approvals/{item.id}".rsplit("/", 1)[0]).status_code == 200
    assert_json_error(
        api.post(f"/api/approvals/{item.id}", {"decision": "answer", "answer": "y"}), 403
    )
    client = Client()
    client.force_login(viewer)
    page = client.get("/approvals/").content.decode()
    assert QUESTION in page and "You can look but not decide." in page
    assert 'name="answer"' not in page
    refused = client.post(
        f"/approvals/{item.id}/decide/", {"action": "answer", "answer": "y"}, **HX
    )
    assert refused.status_code == 403
    assert Approval.objects.get(id=item.id).status == ApprovalStatus.PENDING
    assert Run.objects.get(id=run.id).status == RunStatus.WAITING


def test_the_inbox_card_escapes_the_question_and_answers_in_place(django_user_model):
    sly = "Refund <script>alert(1)</script> & close?"
    run = asked(question=sly, choices=["yes <b>now</b>", "no"])
    item = Approval.objects.get(run=run)
    client = Client()
    client.force_login(make_user(django_user_model, "colleague", DECIDER))
    page = client.get("/approvals/").content.decode()
    assert "<script>alert(1)</script>" not in page and "<b>now</b>" not in page
    assert "Refund &lt;script&gt;alert(1)&lt;/script&gt; &amp; close?" in page
    assert 'value="yes &lt;b&gt;now&lt;/b&gt;"' in page  # each choice a button of the form
    answered = client.post(
        f"/approvals/{item.id}/decide/", {"action": "answer", "answer": "yes <b>now</b>"}, **HX
    )
    assert answered.status_code == 200 and answered["X-Decision-Status"] == "200"
    html = answered.content.decode()
    assert "Answered; the run continues with your answer." in html
    assert "“yes &lt;b&gt;now&lt;/b&gt;”" in html  # the decided card shows the answer, escaped
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", "yes <b>now</b>")]


def test_free_text_answer_in_the_inbox_and_an_empty_one_is_refused(django_user_model):
    run = asked()
    item = Approval.objects.get(run=run)
    client = Client()
    client.force_login(make_user(django_user_model, "colleague", DECIDER))
    page = client.get("/approvals/").content.decode()
    assert f'id="a{item.id}-answer" name="answer"' in page
    empty = client.post(f"/approvals/{item.id}/decide/", {"action": "answer", "answer": ""}, **HX)
    assert empty["X-Decision-Status"] == "400" and "Give an answer" in empty.content.decode()
    ok = client.post(
        f"/approvals/{item.id}/decide/", {"action": "answer", "answer": "Yes, 60 days"}, **HX
    )
    assert ok["X-Decision-Status"] == "200"
    assert advance(run).output.startswith("Colleague said: ask_human=Yes, 60 days")


def test_webhooks_question_asked_and_answered_go_through_the_outbox(django_user_model):
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", secret="whsec_" + "A" * 32)
    run = asked(choices=["yes", "no"])
    item = Approval.objects.get(run=run)
    services.answer(item.id, user=make_user(django_user_model, "colleague", DECIDER), answer="no")
    sent = list(WebhookDelivery.objects.filter(approval_id=item.id).order_by("id"))
    assert [d.event_type for d in sent] == ["question.asked", "question.answered"]
    asked_data = json.loads(sent[0].body)["data"]["approval"]
    assert (asked_data["kind"], asked_data["question"], asked_data["choices"]) == (
        "question",
        QUESTION,
        ["yes", "no"],
    )
    assert asked_data["answer"] == ""
    answered = json.loads(sent[1].body)["data"]
    assert (
        answered["approval"]["answer"] == "no" and answered["approval"]["decided_by"] == "colleague"
    )
    assert answered["run"]["id"] == str(run.id)


def test_claims_and_escalation_work_on_questions(django_user_model, settings):
    run = asked()
    item = Approval.objects.get(run=run)
    first = make_user(django_user_model, "first", DECIDER)
    claims.claim(item.id, user=first)
    assert Approval.objects.get(id=item.id).claimant() == first
    Approval.objects.filter(id=item.id).update(due_at=timezone.now() - timedelta(seconds=1))
    assert escalation.escalate_due_approvals() == 1
    assert events(run, "approval.escalated")[-1].data["approval"] == item.id
    services.answer(item.id, user=first, answer="yes")
    assert Approval.objects.get(id=item.id).claimant() is None  # answered: nobody holds it


def test_a_later_question_is_asked_anew_and_each_gets_its_own_answer(django_user_model):
    """Two questions in two turns: the first, answered, replays as its call's result and the
    second waits for its own answer (a question's wait is found by its call, not its order)."""
    question_agent.SEEN.clear()
    run = advance(
        start(
            "pa-asker",
            ("ask_human", {"question": "First?"}),
            ("ask_human", {"question": "Second?", "choices": ["a", "b"]}),
            say="Heard:",
        )
    )
    colleague = make_user(django_user_model, "colleague", DECIDER)
    services.answer(Approval.objects.get(run=run).id, user=colleague, answer="one")
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    second = Approval.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert (second.question, second.choices) == ("Second?", ["a", "b"])
    services.answer(second.id, user=colleague, answer="b")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", "one"), ("ask_human", "b")]
    assert run.output.startswith("Heard: ask_human=b")


def test_a_cancel_withdraws_the_question(django_user_model):
    run = asked()
    item = Approval.objects.get(run=run)
    run_services.cancel_run(run.id, user=make_user(django_user_model, "op", superuser=True))
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("resolved", "withdrawn")
    api = ApiClient(make_user(django_user_model, "colleague", DECIDER))
    late = api.post(f"/api/approvals/{item.id}", {"decision": "answer", "answer": "yes"})
    assert_json_error(late, 409)


def test_a_run_ended_after_its_page_showed_the_question_shows_at_once(django_user_model):
    """The card's head is cached by what it shows (`Card.shown_fingerprint`): the run cancelled,
    the item's own page shows it withdrawn on the next look, its chip too."""
    run = asked()
    item = Approval.objects.get(run=run)
    client = Client()
    client.force_login(make_user(django_user_model, "colleague", DECIDER))
    page = f"/approvals/{item.id}/"
    assert '<span class="chip s-waiting">question</span>' in client.get(page).content.decode()
    run_services.cancel_run(run.id, user=make_user(django_user_model, "op", superuser=True))
    after = client.get(page).content.decode()
    assert '<span class="chip s-succeeded">resolved</span>' in after
    assert '<span class="chip s-waiting">question</span>' not in after


def test_a_question_deferred_by_any_tool_lands_in_the_inbox(django_user_model):
    """A tool raising `CallDeferred(kind="question")` (as Pydantic AI Harness's `AskUser` does)
    is asked in the inbox like `ask_human`, and the answer is its result."""
    run = advance(start("pa-policy", ("policy_check", {"order_id": "ORD-9"}), say="Policy:"))
    assert run.status == RunStatus.WAITING, run.error
    item = Approval.objects.get(run=run)
    assert (item.kind, item.question, item.choices) == ("question", "Refund ORD-9?", ["yes", "no"])
    colleague = make_user(django_user_model, "colleague", DECIDER)
    services.answer(item.id, user=colleague, answer="yes")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output.startswith("Policy: policy_check=yes")


def test_the_run_page_shows_the_question_and_the_answer_as_text(django_user_model):
    run = asked(question="Refund <i>all</i>?")
    lead = make_user(django_user_model, "lead", superuser=True)
    services.answer(Approval.objects.get(run=run).id, user=lead, answer="yes <b>all</b>")
    advance(run)
    client = Client()
    client.force_login(lead)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Refund &lt;i&gt;all&lt;/i&gt;?" in page and "<i>all</i>" not in page
    assert "question requested" in page
    assert '<span class="chip s-succeeded">answered</span>' in page
    assert "yes &lt;b&gt;all&lt;/b&gt;" in page and "<b>all</b>" not in page


def test_a_question_without_text_or_with_one_choice_goes_back_to_the_model():
    run = asked(question="  ")
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not Approval.objects.filter(run=run).exists()
    assert "ask_human needs a question" in run.output  # the retry prompt the model read
    run = asked(choices=["only"])
    assert run.status == RunStatus.SUCCEEDED and not Approval.objects.filter(run=run).exists()
    assert "at least two distinct choices" in run.output


def test_every_agent_may_add_the_waiting_tools():
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from agentruns.registry import get_agent, register_agent, wait_tools

    second = Agent(
        FunctionModel(question_agent.asking), name="pa-asker-too", toolsets=[wait_tools()]
    )
    register_agent(second)  # the same ask_human as pa-asker's: no clash of tool names
    assert "ask_human" in get_agent("pa-asker-too").tools
