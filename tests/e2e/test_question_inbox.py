"""A question to a colleague in a real Chromium (daphne + qcluster on PostgreSQL): the agent's
`ask_human` call appears in the inbox as a question card without a reload; a person types an
answer, then the agent's second question (with choices) appears and the person clicks a choice;
the run continues with each answer as the call's result and ends with both in its output.
"""

from __future__ import annotations

from agentruns.models import RunStatus
from agentruns.services import start_run
from approvals.models import Approval, ApprovalStatus
from tests.approvals import question_agent  # noqa: F401  (registers pa-asker in this process)
from tests.e2e.kit import browser_marks, logged_in_page, set_browser_password
from tests.helpers import make_user
from tests.procs import start_web, start_worker, wait_finished, wait_until
from tests.pydantic_ai.kit import plan

pytestmark = browser_marks()

WAIT_MS = 90_000
MODULES = {"AGENTRUNS_AGENT_MODULES": "tests.approvals.question_agent"}
FIRST = "Is ORD-1010 eligible under the new <60-day> policy?"
SECOND = "Refund in full or half?"


def pending_question(run) -> Approval | None:
    return Approval.objects.filter(run=run, kind="question", status=ApprovalStatus.PENDING).first()


def test_a_colleague_answers_questions_in_the_inbox_and_the_run_goes_on(
    tmp_path, browser, settings, django_user_model
):
    colleague = make_user(
        django_user_model, "colleague", ["approvals.decide_approval", "approvals.view_approval"]
    )
    set_browser_password(colleague, settings)
    web, url = start_web(tmp_path, **MODULES)
    worker = start_worker(tmp_path, **MODULES)
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
        worker.stop()
        web.stop()
        from django.db import connections

        connections.close_all()
