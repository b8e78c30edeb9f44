"""The AI SDK chat example (examples/chat, built by `make example`) in a real Chromium against
daphne + qcluster: a session user chats (CSRF-checked POSTs), the refund parks for approval,
a reload mid-chat resumes the same message, Approve in the page finishes the run, and the
gateway ledger shows one refund.
"""

from __future__ import annotations

import os
import re

import httpx

from agentruns.models import Run
from config.examples import BUNDLE
from support.models import Order
from tests import binaries
from tests.conftest import make_user
from tests.e2e.kit import browser_marks
from tests.procs import start_web, start_worker

pytestmark = browser_marks()

WAIT_MS = 90_000
PERMS = [
    "agentruns.view_run",
    "agentruns.start_run",
    "approvals.view_approval",
    "approvals.decide_approval",
]


def test_the_example_chat_page_drives_a_run_through_its_approval(
    tmp_path, seeded, browser, settings, django_user_model
):
    from django.conf import global_settings

    if not BUNDLE.is_file():
        binaries.require("npm", "building the chat example")  # make test builds it with npm
        raise AssertionError("build the example first: make example")
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the server's real hashers
    user = make_user(django_user_model, "chatter", PERMS)
    user.set_password("browser-pw")
    user.save()
    order = Order.objects.filter(amount_cents__gt=10_000).order_by("order_id").first()
    web, url = start_web(tmp_path)
    worker = start_worker(
        tmp_path,
        REFUND_GATEWAY_URL=url + "/gateway",
        REFUND_APPROVAL_THRESHOLD_CENTS=10_000,
        SCRIPTED_MODEL_DELAY_MS=5,
    )
    try:
        page = browser.new_page()
        page.goto(url + "/accounts/login/?next=/examples/chat/")
        page.fill("input[name=username]", "chatter")
        page.fill("input[name=password]", "browser-pw")
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/examples/chat/$"))

        page.fill("input[name=order_id]", order.order_id)
        page.fill("input[name=message]", "The kettle leaks <b>badly</b>, refund please.")
        page.click("#chat-form button[type=submit]")
        approve = page.locator(".chat-tool[data-tool=issue_refund] button.ok")
        approve.wait_for(timeout=WAIT_MS)
        run = Run.objects.get(thread_turn__isnull=False, agent="refund")
        assert run.status == "waiting" and run.created_by_id == user.id
        assert "<b>badly</b>" in page.locator(".role-user").inner_text()  # text, not markup

        page.reload()  # resumes: the same assistant message comes back from the server
        approve.wait_for(timeout=WAIT_MS)
        assert page.locator(".chat-msg.role-assistant").count() == 1
        approve.click()
        page.locator(".chat-tool[data-tool=issue_refund].state-output-available").wait_for(
            timeout=WAIT_MS
        )
        page.wait_for_function(  # an arrow function: a bare expression is eval'd (CSP)
            "() => document.getElementById('chat-status').dataset.status === 'ready'"
            " && document.querySelector('.role-assistant .chat-run-status')"
            "?.textContent === 'succeeded'",
            timeout=WAIT_MS,
        )
        if os.environ.get("CHAT_SCREENSHOT"):  # for a person to look at the page
            page.screenshot(path=os.environ["CHAT_SCREENSHOT"], full_page=True)
        run.refresh_from_db()
        assert run.status == "succeeded"
        texts = page.locator(".role-assistant .chat-text").all_inner_texts()
        assert texts[-1] == run.output
        refunds = httpx.get(url + "/gateway/refunds", params={"order_id": order.order_id})
        assert [r["amount_cents"] for r in refunds.json()["refunds"]] == [order.amount_cents]
    finally:
        worker.kill()
        web.kill()


def test_the_example_chats_stop_button_stops_the_run_and_keeps_its_text(
    tmp_path, browser, settings, django_user_model
):
    """The page's Stop asks the server to stop (the AI SDK's stop() would only drop the fetch):
    the model's answer ends mid-stream, the page keeps the text so far and shows the run
    cancelled, and the run's output is that text."""
    from django.conf import global_settings

    from scripts.fake_openai_server import FakeOpenAI, Reply
    from tests.providers.kit import API_KEY

    if not BUNDLE.is_file():
        binaries.require("npm", "building the chat example")
        raise AssertionError("build the example first: make example")
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    user = make_user(django_user_model, "chatter", PERMS)
    user.set_password("browser-pw")
    user.save()
    long_answer = "word " * 400
    with FakeOpenAI(mode="error", api_key=API_KEY) as fake:
        fake.script(Reply(text=long_answer, chunk_chars=4, delay=0.02))
        env = {
            "AGENTRUNS_AGENT_MODULES": "tests.testkit",
            "AGENTRUNS_MODEL": "openai:fake-model",
            "OPENAI_BASE_URL": fake.url,
            "OPENAI_API_KEY": API_KEY,
        }
        web, url = start_web(tmp_path, **env)
        worker = start_worker(tmp_path, **env)
        try:
            page = browser.new_page()
            page.goto(url + "/accounts/login/?next=/examples/chat/%3Fagent%3Dscript")
            page.fill("input[name=username]", "chatter")
            page.fill("input[name=password]", "browser-pw")
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"/examples/chat/"))
            page.fill("input[name=message]", "Tell me a long story.")
            page.click("#chat-form button[type=submit]")
            page.wait_for_function(
                "() => (document.querySelector('.role-assistant .chat-text')?.textContent || '')"
                ".length > 40",
                timeout=WAIT_MS,
            )
            page.click("#chat-stop")
            page.wait_for_function(
                "() => document.getElementById('chat-status').dataset.status === 'ready'"
                " && document.querySelector('.role-assistant .chat-run-status')"
                "?.textContent === 'cancelled'",
                timeout=WAIT_MS,
            )
            shown = page.locator(".role-assistant .chat-text").all_inner_texts()
            assert page.locator("#chat-stop").is_hidden()
        finally:
            worker.kill()
            web.kill()
    run = Run.objects.get(thread_turn__isnull=False, agent="script")
    assert (run.status, run.stop_reason) == ("cancelled", "stopped")
    assert shown == [run.output] and 40 < len(run.output) < len(long_answer)
