"""A two-person approval in a real Chromium: two approvers in two browser contexts (daphne +
qcluster on PostgreSQL). The first approval shows up live in the second approver's inbox
("1 of 2: approved by approver just now"), the second approval sends the refund, and the gateway's
ledger shows exactly one.
"""

from __future__ import annotations

import re

import httpx

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from approvals.models import Approval, ApprovalStatus
from tests.conftest import make_user
from tests.e2e.kit import browser_marks
from tests.procs import start_web, start_worker, wait_until

pytestmark = browser_marks()

WAIT_MS = 90_000


def signed_in(browser, url: str, username: str):
    context = browser.new_context()
    page = context.new_page()
    page.goto(url + "/accounts/login/?next=/approvals/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "browser-pw")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/approvals/$"))
    return context, page


def test_two_approvers_in_two_browsers(tmp_path, seeded, browser, settings, django_user_model):
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the server's real hashers
    for name in ("approver", "approver2"):
        user = django_user_model.objects.get(username=name)
        user.set_password("browser-pw")
        user.save()
    clerk = make_user(django_user_model, "clerk", ["agentruns.start_run", "agentruns.view_run"])
    web, url = start_web(tmp_path)
    worker = start_worker(
        tmp_path,
        REFUND_GATEWAY_URL=url + "/gateway",
        REFUND_APPROVAL_THRESHOLD_CENTS=0,
        REFUND_TWO_PERSON_CENTS=10_000,
    )
    contexts = []
    try:
        first_ctx, first = signed_in(browser, url, "approver")
        second_ctx, second = signed_in(browser, url, "approver2")
        contexts += [first_ctx, second_ctx]

        run = start_run("refund", {"order_id": "ORD-1001", "message": "It broke"}, user=clerk).run
        approval = wait_until(
            lambda: Approval.objects.filter(run=run).first(), timeout=90, message="the approval"
        )
        card = f"#approval-{approval.id}"
        for page in (first, second):
            page.locator(card).wait_for(timeout=WAIT_MS)
            assert "0 of 2" in page.locator(f"{card} .two-person").inner_text()

        first.locator(f"{card} button[value=approve]").click()
        first.locator("#decision-log li").first.wait_for(timeout=WAIT_MS)
        assert "Your approval is 1 of 2" in first.locator("#decision-log").inner_text()
        # the first approver may not approve twice: only "Reject" is left on their card
        first.locator(f"{card} .you-may-not").wait_for(timeout=WAIT_MS)
        assert first.locator(f"{card} button[value=approve]").count() == 0

        # the second approver's inbox shows it live, without a reload
        # (an arrow function: a bare expression is eval'd, which the CSP refuses)
        second.wait_for_function(
            f"""() => (document.querySelector('{card} .two-person') || {{textContent: ''}})
                .textContent.match(/1 of 2: approved by approver (just now|\\d+ min ago)/)""",
            timeout=WAIT_MS,
        )
        assert (
            "except clerk (started the run), approver (approved)"
            in second.locator(f"{card} .two-person").inner_text()
        )
        refunds = httpx.get(url + "/gateway/refunds", params={"order_id": "ORD-1001"}).json()
        assert refunds["refunds"] == []  # one approval of two: nothing executed
        assert Run.objects.get(id=run.id).status == RunStatus.WAITING

        second.locator(f"{card} button[value=approve]").click()
        second.locator("#decision-log li").first.wait_for(timeout=WAIT_MS)
        assert "Approved" in second.locator("#decision-log").inner_text()
        for page in (first, second):  # decided items leave both inboxes
            page.locator(card).wait_for(state="detached", timeout=WAIT_MS)

        def finished():
            fresh = Run.objects.get(id=run.id)
            return fresh if fresh.is_terminal else None

        done = wait_until(finished, timeout=120, message="the run to finish")
        assert done.status == RunStatus.SUCCEEDED, done.error
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.APPROVED and approval.approvals_given == 2
        ledger = httpx.get(url + "/gateway/refunds", params={"order_id": "ORD-1001"}).json()
        assert len(ledger["refunds"]) == 1
    finally:
        for context in contexts:
            context.close()
        worker.stop()
        web.stop()
