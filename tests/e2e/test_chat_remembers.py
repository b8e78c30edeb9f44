"""The AI SDK chat example remembers (issue 44, item 5), in a real Chromium with the real `ai`
client (examples/chat, built by `make example`) against daphne + qcluster on PostgreSQL, the
refund agent on the fake OpenAI server (which records what the model received):

1. a follow-up after a finished turn continues the same chat (one thread, its runs in order),
   the model's request holds the earlier turn (the customer's first words, the refund it made),
   and the page still shows the earlier messages, also after a reload;
2. the same after a refund approved in the page;
3. tool calls and results read as words (amounts in the order's currency, not JSON in cents),
   the JSON one click away; axe-core finds nothing serious on the page.
"""

from __future__ import annotations

import re

from agentruns.models import Run, RunStatus, Thread
from config.examples import BUNDLE
from scripts.fake_openai_server import FakeOpenAI
from support.models import Order
from tests import binaries
from tests.e2e.kit import WAIT_MS, Journey, axe_problems, browser_marks, set_browser_password
from tests.helpers import make_user
from tests.procs import start_web, start_worker
from tests.providers.kit import API_KEY

pytestmark = browser_marks()

PERMS = [
    "agentruns.view_run",
    "agentruns.start_run",
    "approvals.view_approval",
    "approvals.decide_approval",
]
THRESHOLD = 10_000  # refunds above 100.00 wait for an approver


def turn_done(page, turns: int) -> None:
    """Wait until the chat is ready with `turns` assistant messages, the last one finished."""
    page.wait_for_function(
        """(n) => document.getElementById('chat-status').dataset.status === 'ready'
            && document.querySelectorAll('.role-assistant').length === n
            && ['succeeded', 'failed', 'cancelled'].includes(
                 [...document.querySelectorAll('.role-assistant .chat-run-status')].pop()
                   ?.textContent)""",
        arg=turns,
        timeout=WAIT_MS,
    )


def send(page, text: str) -> None:
    page.fill("input[name=message]", text)
    page.click("#chat-form button[type=submit]")


def user_texts(page) -> list[str]:
    return [t.strip() for t in page.locator(".role-user .chat-text").all_inner_texts()]


def request_with(fake: FakeOpenAI, text: str) -> list[dict]:
    """The messages of the model's first request that carries `text` in a user message."""
    for request in fake.chat_requests():
        users = [m for m in request.messages if m.get("role") == "user"]
        if users and text in str(users[-1].get("content")):
            return request.messages
    raise AssertionError(f"no model request asked about {text!r}")


def said(messages: list[dict], role: str) -> str:
    return "\n".join(str(m.get("content")) for m in messages if m.get("role") == role)


def no_serious_axe_findings(journey: Journey, where: str) -> None:
    problems = axe_problems(journey.page)
    assert not problems, f"axe on {where}:\n" + "\n".join(problems)


def test_the_chat_continues_after_a_finished_turn_and_after_an_approved_refund(
    tmp_path, seeded, browser, settings, django_user_model
):
    if not BUNDLE.is_file():
        binaries.require("npm", "building the chat example")  # make test builds it with npm
        raise AssertionError("build the example first: make example")
    user = make_user(django_user_model, "chatter", PERMS)
    set_browser_password(user, settings)
    small = Order.objects.filter(amount_cents__lt=THRESHOLD).order_by("order_id").first()
    large = Order.objects.filter(amount_cents__gt=THRESHOLD).order_by("order_id").first()
    with FakeOpenAI(mode="refund", api_key=API_KEY) as fake:
        env = {
            "AGENTRUNS_MODEL": "openai:fake-model",
            "OPENAI_BASE_URL": fake.url,
            "OPENAI_API_KEY": API_KEY,
            "REFUND_APPROVAL_THRESHOLD_CENTS": THRESHOLD,
        }
        web, url = start_web(tmp_path, **env)
        worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway", **env)
        try:
            journey = Journey.open(browser, url, "chat-remembers")
            page = journey.page
            journey.sign_in("chatter", then="/examples/chat/")
            page.wait_for_selector("#chat-form")

            # 1. a turn that finishes (no approval needed), then a follow-up
            first = f"The kettle from {small.order_id} leaks, please refund it."
            page.fill("input[name=order_id]", small.order_id)
            send(page, first)
            turn_done(page, 1)
            chat_id = page.evaluate(
                "() => JSON.parse(sessionStorage.getItem('agentruns-example-chat')).id"
            )
            output = page.locator(".role-assistant .chat-tool[data-tool=issue_refund] .chat-output")
            shown = output.inner_text()
            assert small.amount in shown and "_cents" not in shown and "{" not in shown, shown
            assert page.get_attribute("input[name=order_id]", "readonly") is not None
            no_serious_axe_findings(journey, "the chat after a finished turn")

            follow_up = "Thanks! Also, did the refund go through?"
            send(page, follow_up)
            turn_done(page, 2)
            thread = Thread.objects.get(id=chat_id)  # the same chat: one thread, two turns
            runs = list(Run.objects.filter(thread=thread).order_by("created_at"))
            assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2
            assert Thread.objects.filter(created_by=user).count() == 1
            seen = request_with(fake, follow_up)  # what the model received for the follow-up
            assert "leaks, please refund it" in said(seen, "user")
            assert "refund_id" in said(seen, "tool")  # the first turn's refund, as its result
            assert user_texts(page) == [first, follow_up]  # the earlier messages stay
            page.reload()
            turn_done(page, 2)
            assert user_texts(page) == [first, follow_up]
            journey.shot("after-a-follow-up")

            # 2. a new chat whose refund waits for approval, approved in the page, then a
            # follow-up
            page.click("#chat-new")
            assert page.locator(".chat-msg").count() == 0
            page.fill("input[name=order_id]", large.order_id)
            asked = f"My order {large.order_id} arrived broken, refund please."
            send(page, asked)
            approve = page.locator(".chat-tool[data-tool=issue_refund] button.ok")
            approve.wait_for(timeout=WAIT_MS)
            waiting = page.locator(".chat-tool[data-tool=issue_refund] .chat-input").inner_text()
            assert large.amount in waiting and "amount_cents" not in waiting, waiting
            no_serious_axe_findings(journey, "the chat waiting for an approval")
            journey.shot("waiting-for-approval")
            approve.click()
            turn_done(page, 1)
            second_id = page.evaluate(
                "() => JSON.parse(sessionStorage.getItem('agentruns-example-chat')).id"
            )
            assert second_id != chat_id
            again = "Great, and when will I see the money?"
            send(page, again)
            turn_done(page, 2)
            runs = list(Run.objects.filter(thread_id=second_id).order_by("created_at"))
            assert len(runs) == 2 and runs[0].outcome == "refunded", [r.outcome for r in runs]
            seen = request_with(fake, again)
            assert "arrived broken, refund please" in said(seen, "user")
            assert "refund_id" in said(seen, "tool")  # the approved refund it made
            assert user_texts(page) == [asked, again]
            refund = page.locator(".role-assistant").first.locator(
                ".chat-tool[data-tool=issue_refund]"
            )
            assert "done" in refund.locator(".chat-tool-state").inner_text()
            assert re.search(re.escape(large.amount), refund.locator(".chat-output").inner_text())
            no_serious_axe_findings(journey, "the chat after an approved refund and a follow-up")
            journey.shot("after-an-approved-refund")
            journey.check_csp()
        finally:
            worker.kill()
            web.kill()
