"""The inbox in a real Chromium (daphne + qcluster on PostgreSQL): items appear without a reload,
typing survives a refresh of the list, approve-with-edits and reject work in place, the nav
count follows, and the gateway ledger agrees.
"""

from __future__ import annotations

import os

from agentruns.models import RunStatus
from agentruns.runtime.values.money import format_cents, major_text
from agentruns.services import start_run
from approvals.models import Approval, ApprovalStatus
from support.models import Order, OutboxMessage
from tests.e2e.kit import browser_marks, logged_in_page, set_browser_password
from tests.procs import gateway_refunds, start_web, start_worker, wait_finished, wait_until

pytestmark = browser_marks()

WAIT_MS = 90_000

# counts the inbox's list refreshes (polls and post-decision reloads)
SWAP_COUNTER = """
window.__swaps = 0;
document.addEventListener("htmx:afterSwap", (e) => { if (e.target.id === "inbox-items") window.__swaps += 1; });
"""


def test_approve_with_a_lowered_amount_and_reject_in_the_inbox(
    tmp_path, seeded, browser, settings, django_user_model
):
    set_browser_password(django_user_model.objects.get(username="approver"), settings)
    web, url = start_web(tmp_path)
    worker = start_worker(
        tmp_path, REFUND_GATEWAY_URL=url + "/gateway", REFUND_APPROVAL_THRESHOLD_CENTS=0
    )
    try:
        page = logged_in_page(browser, url, "approver", SWAP_COUNTER, next_path="/approvals/")
        assert page.locator("#nav-pending").inner_text() == "0"

        # two refund runs start while the page is open: they appear without a reload
        first = start_run(
            "refund", {"order_id": "ORD-1010", "message": "The lamp arrived broken"}
        ).run
        second = start_run("refund", {"order_id": "ORD-1011", "message": "It never arrived"}).run
        a1 = wait_until(
            lambda: Approval.objects.filter(run=first).first(), timeout=90, message="first approval"
        )
        a2 = wait_until(
            lambda: Approval.objects.filter(run=second).first(),
            timeout=90,
            message="second approval",
        )
        card1, card2 = page.locator(f"#approval-{a1.id}"), page.locator(f"#approval-{a2.id}")
        card1.wait_for(timeout=WAIT_MS)
        card2.wait_for(timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.getElementById('nav-pending').textContent.trim() === '2'",
            timeout=WAIT_MS,
        )
        order = Order.objects.get(order_id="ORD-1010")
        assert order.customer_name in card1.inner_text()
        assert f"{order.amount_cents / 100:,.2f} USD" in card1.inner_text()
        if os.environ.get("INBOX_SCREENSHOT"):  # for a person to look at the layout
            page.screenshot(path=os.environ["INBOX_SCREENSHOT"], full_page=True)

        # type a lowered amount; a third item arrives meanwhile, the list re-renders, and the
        # typing survives (the decision forms are hx-preserve'd)
        lowered = order.amount_cents - 500
        card1.locator("details.edit > summary").click()
        amount = card1.locator("input[name=arg_amount_cents]")
        amount.fill(major_text(lowered))  # typed in the order's currency (issue 34)
        assert "Will approve with: Amount" in card1.locator(".diff-preview").inner_text()
        swaps = page.evaluate("window.__swaps")
        third = start_run("refund", {"order_id": "ORD-1012", "message": "Wrong colour"}).run
        a3 = wait_until(
            lambda: Approval.objects.filter(run=third).first(), timeout=90, message="third approval"
        )
        page.locator(f"#approval-{a3.id}").wait_for(timeout=WAIT_MS)
        assert page.evaluate("window.__swaps") > swaps
        assert page.locator(
            f"#approval-{a1.id} input[name=arg_amount_cents]"
        ).input_value() == major_text(lowered)
        assert (
            "Will approve with: Amount"
            in page.locator(f"#approval-{a1.id} .diff-preview").inner_text()
        )

        page.locator(f"#approval-{a1.id} button[value=approve]").click()
        log = page.locator("#decision-log")
        log.locator("li").first.wait_for(timeout=WAIT_MS)
        shown = f"{format_cents(order.amount_cents, 'USD')} → {format_cents(lowered, 'USD')}"
        assert f"amount {shown}" in log.inner_text()
        page.locator(f"#approval-{a1.id}").wait_for(state="detached", timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.getElementById('nav-pending').textContent.trim() === '2'",
            timeout=WAIT_MS,
        )

        why = "the parcel is still on its way"
        page.locator(f"#approval-{a2.id} input[name=reason]").fill(why)
        page.locator(f"#approval-{a2.id} button[value=reject]").click()
        page.locator(f"#approval-{a2.id}").wait_for(state="detached", timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.getElementById('nav-pending').textContent.trim() === '1'",
            timeout=WAIT_MS,
        )
        assert page.locator(f"#approval-{a3.id}").is_visible()
        assert "Rejected" in log.inner_text()

        first, second = wait_finished(first, worker), wait_finished(second, worker)
        assert first.status == RunStatus.SUCCEEDED and second.status == RunStatus.SUCCEEDED
        assert Approval.objects.get(id=a1.id).status == ApprovalStatus.APPROVED
        refunds = gateway_refunds(url, "ORD-1010")
        assert [r["amount_cents"] for r in refunds] == [lowered]
        assert gateway_refunds(url, "ORD-1011") == []
        assert why in OutboxMessage.objects.get(run_id=second.id).body
    finally:
        worker.stop()
        web.stop()
        # with Playwright's loop running, this body had its own DB connection: close it so the
        # test database can be dropped at the end of the session
        from django.db import connections

        connections.close_all()
