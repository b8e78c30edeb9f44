"""The inbox in two real Chromium sessions (daphne on PostgreSQL): a claim taken in one shows
as "taken by" in the other without a reload, deciding it there asks first; an item is approved
and another rejected from the keyboard; two are approved in bulk with one reason."""

from __future__ import annotations

import os
import re

from django.conf import global_settings

from agentruns.services import start_run
from approvals.models import Approval, ApprovalStatus
from tests.conftest import make_user
from tests.e2e.kit import browser_marks
from tests.helpers import advance
from tests.procs import start_web

pytestmark = browser_marks(300)

WAIT_MS = 30_000
PERMS = ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"]


def parked(amount: int) -> Approval:
    run = start_run(
        "script", {"script": [{"text": "Paying.", "calls": [["t_pay", {"amount": amount}]]}]}
    ).run
    advance(run)
    return Approval.objects.get(run=run)


def sign_in(browser, url: str, username: str):
    page = browser.new_page()
    page.goto(url + "/accounts/login/?next=/approvals/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "browser-pw")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/approvals/$"))
    return page


def status(approval: Approval) -> str:
    return Approval.objects.get(id=approval.id).status


def test_claims_live_keyboard_and_bulk(tmp_path, browser, settings, django_user_model):
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the server's own hashers
    for name in ("alice", "bob"):
        user = make_user(django_user_model, name, PERMS)
        user.set_password("browser-pw")
        user.save()
    items = [parked(200 + i) for i in range(5)]  # newest last
    web, url = start_web(tmp_path, AGENTRUNS_AGENT_MODULES="tests.testkit")
    try:
        alice, bob = sign_in(browser, url, "alice"), sign_in(browser, url, "bob")
        dialogs: list[str] = []

        # alice takes item 0; bob sees it taken without reloading
        alice.locator(f"#approval-{items[0].id} .claim-button").click()
        alice.locator(f"#approval-{items[0].id} .claim.mine").wait_for(timeout=WAIT_MS)
        bob_card = bob.locator(f"#approval-{items[0].id}")
        bob_card.locator(".claim").wait_for(timeout=WAIT_MS)
        assert "taken by alice" in bob_card.locator(".claim").inner_text()
        if os.environ.get("INBOX_SCREENSHOT"):  # for a person to look at the layout
            bob.locator(f"#select-{items[1].id}").check()
            bob.screenshot(path=os.environ["INBOX_SCREENSHOT"], full_page=True)
            bob.locator(f"#select-{items[1].id}").uncheck()
        assert bob_card.locator(".claim-button").count() == 0

        # bob tries to approve it: asked first; saying no changes nothing
        def answer(dialog, accept: bool) -> None:
            dialogs.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        posted: list[str] = []
        bob.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
        bob.once("dialog", lambda d: answer(d, False))
        bob_card.locator("button[value=approve]").click()
        assert dialogs == ["alice is on this item. Decide it anyway?"]
        assert posted == []  # htmx asks before it sends: nothing was sent
        assert status(items[0]) == ApprovalStatus.PENDING

        # keyboard: alice marks item 4 (the newest, first in the list) with j and approves it
        alice.keyboard.press("j")
        assert (
            alice.locator("article.card.focused").get_attribute("id") == f"approval-{items[4].id}"
        )
        alice.keyboard.press("a")
        alice.locator(f"#approval-{items[4].id}").wait_for(state="detached", timeout=WAIT_MS)
        assert status(items[4]) == ApprovalStatus.APPROVED
        # r focuses the reason; Enter rejects the next item with it
        alice.keyboard.press("j")
        focused = alice.locator("article.card.focused").get_attribute("id")
        alice.keyboard.press("r")
        alice.keyboard.type("duplicate of an earlier refund")
        alice.keyboard.press("Enter")
        alice.locator(f"#{focused}").wait_for(state="detached", timeout=WAIT_MS)
        rejected = Approval.objects.get(id=int(focused.split("-")[1]))
        assert rejected.status == ApprovalStatus.REJECTED
        assert rejected.reason == "duplicate of an earlier refund"
        alice.keyboard.press("?")
        assert alice.locator("#shortcut-help").is_visible()
        alice.keyboard.press("Escape")

        # bulk: bob selects the two left besides alice's and approves them with one reason
        rest = [a for a in items[1:4] if a.id != rejected.id]
        for approval in rest:
            bob.locator(f"#select-{approval.id}").check()
        assert bob.locator(".bulk-count").inner_text() == "2 selected"
        bob.fill("#bulk-form input[name=reason]", "outage batch")
        bob.click("#bulk-form button[value=approve]")
        bob.locator("#decision-log .bulk-summary").wait_for(timeout=WAIT_MS)
        assert "2 approved" in bob.locator("#decision-log").inner_text()
        for approval in rest:
            bob.locator(f"#approval-{approval.id}").wait_for(state="detached", timeout=WAIT_MS)
            assert status(approval) == ApprovalStatus.APPROVED
            assert Approval.objects.get(id=approval.id).reason == "outage batch"
        assert status(items[0]) == ApprovalStatus.PENDING  # alice's item, untouched

        # bob decides alice's item anyway, confirming this time
        bob.once("dialog", lambda d: answer(d, True))
        bob_card.locator("button[value=approve]").click()
        bob_card.wait_for(state="detached", timeout=WAIT_MS)
        assert status(items[0]) == ApprovalStatus.APPROVED
        assert Approval.objects.get(id=items[0].id).decided_by.username == "bob"
    finally:
        web.stop()
        from django.db import connections

        connections.close_all()
