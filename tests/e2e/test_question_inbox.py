"""A question to a colleague in a real Chromium (daphne + qcluster on PostgreSQL): the agent's
`ask_human` call appears in the inbox as a question card without a reload; a person types an
answer, then the agent's second question (with choices) appears and the person clicks a choice;
the run continues with each answer as the call's result and ends with both in its output. And
the same in the AI SDK chat example: the question waits in the page, a click answers it.
Both share the module's daphne and worker.
"""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from approvals.models import Approval, ApprovalStatus
from config.examples import BUNDLE
from tests import binaries
from tests.approvals import question_agent  # noqa: F401  (registers pa-asker in this process)
from tests.e2e.kit import browser_marks, logged_in_page, set_browser_password
from tests.helpers import make_user
from tests.procs import module_web_and_worker, wait_finished, wait_until
from tests.pydantic_ai.kit import plan

pytestmark = browser_marks()

WAIT_MS = 90_000
MODULES = {"AGENTRUNS_AGENT_MODULES": "tests.approvals.question_agent"}
FIRST = "Is ORD-1010 eligible under the new <60-day> policy?"
SECOND = "Refund in full or half?"
CHAT_PERMS = [
    "agentruns.view_run",
    "agentruns.start_run",
    "approvals.view_approval",
    "approvals.decide_approval",
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker):
    """The module's daphne and worker, with the question agent: (URL, worker)."""
    with module_web_and_worker(tmp_path_factory, django_db_blocker, **MODULES) as url_and_worker:
        yield url_and_worker


def pending_question(run) -> Approval | None:
    return Approval.objects.filter(run=run, kind="question", status=ApprovalStatus.PENDING).first()


def test_a_colleague_answers_questions_in_the_inbox_and_the_run_goes_on(
    servers, browser, settings, django_user_model
):
    colleague = make_user(
        django_user_model, "colleague", ["approvals.decide_approval", "approvals.view_approval"]
    )
    set_browser_password(colleague, settings)
    url, worker = servers
    try:
        page = logged_in_page(browser, url, "colleague", "", next_path="/approvals/")
        message = plan(
            ("ask_human", {"question": FIRST}),
            ("ask_human", {"question": SECOND, "choices": ["full", "half"]}),
            say="Colleague said:",
        )
        run = start_run("pa-asker", {"message": message}).run
        first = wait_until(lambda: pending_question(run), timeout=90, message="first question")
        card = page.locator(f"#approval-{first.id}")
        card.wait_for(timeout=WAIT_MS)
        assert FIRST in card.locator(".question-text").inner_text()  # shown as text, escaped
        card.locator("textarea[name=answer]").fill("Yes: delivered 12 days ago")
        card.locator("button.answer-button").click()
        log = page.locator("#decision-log")
        log.locator("li").first.wait_for(timeout=WAIT_MS)
        assert "Answered; the run continues" in log.inner_text()

        second = wait_until(
            lambda: (q := pending_question(run)) is not None and q.id != first.id and q,
            timeout=90,
            message="second question",
        )
        card = page.locator(f"#approval-{second.id}")
        card.wait_for(timeout=WAIT_MS)
        assert SECOND in card.inner_text()
        card.locator("button.choice-button", has_text="half").click()
        card.wait_for(state="detached", timeout=WAIT_MS)

        run = wait_finished(run, worker)
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert run.output.startswith("Colleague said: ask_human=half")
        answers = list(
            Approval.objects.filter(run=run).order_by("id").values_list("answer", "decided_by")
        )
        assert answers == [("Yes: delivered 12 days ago", colleague.pk), ("half", colleague.pk)]
        first_step = Approval.objects.get(id=first.id).step
        first_step.refresh_from_db()
        assert first_step.result == "Yes: delivered 12 days ago"  # what the model read
    finally:
        from django.db import connections

        connections.close_all()


def test_the_chat_example_asks_the_question_and_the_answer_continues_the_run(
    servers, browser, settings, django_user_model
):
    """The AI SDK chat example (examples/chat): the `ask_human` call waits in the page as a
    question with its choices; a click answers it (addToolOutput) and the same assistant message
    goes on to the run's end."""
    if not BUNDLE.is_file():
        binaries.require("npm", "building the chat example")  # make test builds it with npm
        raise AssertionError("build the example first: make example")
    user = make_user(django_user_model, "chatter", CHAT_PERMS)
    set_browser_password(user, settings)
    url, worker = servers
    try:
        page = logged_in_page(
            browser, url, "chatter", "", next_path="/examples/chat/?agent=pa-asker"
        )
        message = plan(
            ("ask_human", {"question": SECOND, "choices": ["full", "half"]}), say="Colleague said:"
        )
        page.fill("input[name=message]", message)
        page.click("#chat-form button[type=submit]")
        question = page.locator(".chat-tool[data-tool=ask_human] .chat-question")
        question.wait_for(timeout=WAIT_MS)
        assert question.locator(".chat-question-text").inner_text() == SECOND
        run = Run.objects.get(thread_turn__isnull=False, agent="pa-asker")
        assert run.status == RunStatus.WAITING
        question.locator("button.chat-choice", has_text="half").click()
        page.wait_for_function(  # an arrow function: a bare expression is eval'd (CSP)
            "() => document.getElementById('chat-status').dataset.status === 'ready'"
            " && document.querySelector('.role-assistant .chat-run-status')"
            "?.textContent === 'succeeded'",
            timeout=WAIT_MS,
        )
        run = wait_finished(run, worker)
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert run.output.startswith("Colleague said: ask_human=half")
        item = Approval.objects.get(run=run)
        assert (item.answer, item.decided_by_id) == ("half", user.pk)
        texts = page.locator(".role-assistant .chat-text").all_inner_texts()
        assert texts[-1] == run.output
    finally:
        from django.db import connections

        connections.close_all()
