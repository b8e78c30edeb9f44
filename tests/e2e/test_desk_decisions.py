"""Decisions at the support desk in a real Chromium (Debian's), against daphne and a real worker
on PostgreSQL (one of each for the module), asserting on the DOM and on the outside world
(issue 34, items 2 to 4):

1. the card of a second request's refund on an order refunded before shows that refund and the
   total in the order's currency, and proposes what is left; the lead lowers the amount typed
   in dollars, and the gateway's ledger has exactly those cents;
2. a rejection's internal note stays with staff: the run page shows it (in the conversation,
   beside the reason the agent was told), and neither the model's stored conversation nor the
   customer's reply holds it (the reply gives the reason);
3. a trainee's run hands over: the hand-over appears in the inbox beside a refund card (axe-core
   finds no serious or critical issue there), an approver takes it and closes it, the decided
   tab shows it closed with the note, and the run page reads "handed over" with the hand-over
   closed in its conversation (axe-core: nothing serious or critical on the page).

Screenshots of each key screen go to var/test-artifacts/e2e/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentruns.models import Run, RunEvent, RunStatus, Step
from agentruns.runtime.values.money import format_cents
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval
from support.desk.actions import do_log_ticket
from support.models import Order, OutboxMessage
from tests.e2e.kit import WAIT_MS, Journey, axe_problems, browser_marks, parked
from tests.procs import Proc, gateway_refunds, module_web_and_worker, wait_finished

pytestmark = browser_marks()

NOTE = "INTERNAL-9c1e: second claim this month, watch this customer"
REASON = "we need a photo of the damaged item first"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[tuple[str, Proc]]:
    """daphne and a qcluster for the module; every refund parks for approval."""
    with module_web_and_worker(
        tmp_path_factory, django_db_blocker, REFUND_APPROVAL_THRESHOLD_CENTS=0
    ) as both:
        yield both


def test_a_second_refund_shows_the_first_and_an_edit_in_dollars_refunds_those_cents(
    servers, people, browser
):
    url, worker = servers
    order = Order.objects.get(order_id="ORD-1020")
    first = start_run("refund", {"order_id": "ORD-1020", "message": "Refund $40 please"}).run
    decisions.approve(parked(first).id, user=people["lead"])
    assert wait_finished(first, worker).outcome == "partially_refunded"
    assert [r["amount_cents"] for r in gateway_refunds(url, "ORD-1020")] == [4000]

    # a second request on the order (one refund per request: issue 44) asks for what is left
    request = do_log_ticket(
        order_id="ORD-1020", subject="The rest", body="Refund the rest", user=people["lead"]
    ).ticket
    second = start_run(
        "refund",
        {"order_id": "ORD-1020", "ticket_id": request.ticket_id, "message": "Refund the rest"},
    ).run
    item = parked(second)
    journey = Journey.open(browser, url, "desk-second-refund")
    journey.sign_in("lead", then="/approvals/")
    card = journey.page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    context = card.locator(".context-facts").inner_text()
    left = format_cents(order.amount_cents - 4000, "USD")
    assert "40.00 USD" in context  # the earlier refund, in the order's currency
    assert "refunded\n40.00 USD" in context  # and the total so far
    assert f"remaining\n{left}" in context
    assert card.locator(".amount").inner_text() == left  # the agent proposed what is left
    journey.shot("second-refund-card")

    card.locator("details.edit > summary").click()
    amount = card.locator("input[name=arg_amount_cents]")
    hint = card.locator("label[for$=-amount_cents]").inner_text()
    assert f"may only be lowered: from 0.01 up to {left} (the requested value)" in hint
    amount.fill("100.25")  # dollars, not cents
    assert "Will approve with: Amount" in card.locator(".diff-preview").inner_text()
    journey.shot("second-refund-edited")
    card.locator("button[value=approve]").click()
    journey.page.locator("#decision-log li").first.wait_for(timeout=WAIT_MS)
    log = journey.page.locator("#decision-log").inner_text()
    assert f"amount {left} → 100.25 USD" in log

    done = wait_finished(second, worker)
    assert (done.status, done.outcome) == (RunStatus.SUCCEEDED, "partially_refunded")
    assert [r["amount_cents"] for r in gateway_refunds(url, "ORD-1020")] == [4000, 10025]
    reply = OutboxMessage.objects.get(run_id=second.id).body
    paid = format_cents(order.amount_cents, "USD")
    assert f"we refunded 100.25 of {paid}" in reply and "Our team reviewed" in reply
    journey.check_csp()


def test_a_rejections_internal_note_stays_with_staff(servers, people, browser):
    url, worker = servers
    run = start_run("refund", {"order_id": "ORD-1021", "message": "The kettle leaks"}).run
    item = parked(run)
    journey = Journey.open(browser, url, "desk-internal-note")
    journey.sign_in("approver", then="/approvals/")
    card = journey.page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    assert "Reason for the customer" in card.locator(f"label[for=a{item.id}-told]").inner_text()
    assert "for staff only" in card.locator(f"label[for=a{item.id}-note]").inner_text()
    card.locator("input[name=reason]").fill(REASON)
    card.locator("input[name=internal_note]").fill(NOTE)
    journey.shot("reject-with-note")
    card.locator("button[value=reject]").click()
    card.wait_for(state="detached", timeout=WAIT_MS)
    log = journey.page.locator("#decision-log").inner_text()
    assert "Your internal note is kept for staff only." in log

    done = wait_finished(run, worker)
    assert (done.status, done.outcome) == (RunStatus.SUCCEEDED, "refund_rejected")
    journey.go(f"/runs/{run.id}/")
    journey.page.locator("#run-outcome").wait_for(timeout=WAIT_MS)
    assert journey.page.locator("#run-outcome").inner_text() == "refund rejected"
    assert "s-succeeded" not in (journey.page.locator("#run-status").get_attribute("class") or "")
    # staff see it in the conversation, beside what the agent was told ...
    decision = journey.page.locator("#approval-card .decision-line")
    assert decision.is_visible() and NOTE in decision.locator(".internal-note").inner_text()
    assert REASON in decision.locator(".told").inner_text()
    # ... and on the step in the engineering detail, one click away
    journey.page.locator("#engineering > summary").click()
    assert NOTE in journey.page.locator("#steps .internal-note").inner_text()
    assert NOTE not in journey.page.locator("#run-output").inner_text()
    journey.shot("run-page-with-note")

    reply = OutboxMessage.objects.get(run_id=run.id).body
    assert REASON in reply and "INTERNAL-9c1e" not in reply
    stored = [
        json.dumps([s.text, s.error, s.arguments, s.result])
        for s in Step.objects.filter(run=run)  # the conversation the model is sent is these
    ]
    assert not [s for s in stored if "INTERNAL-9c1e" in s]
    assert not RunEvent.objects.filter(run=run, data__icontains="INTERNAL-9c1e").exists()
    journey.check_csp()


def test_a_trainees_hand_over_is_in_the_inbox_and_is_closed(servers, people, browser):
    url, worker = servers
    message = "My backpack strap tore, I want my money back"
    handed = start_run(
        "refund", {"order_id": "ORD-1022", "message": message}, user=people["trainee"]
    ).run
    done = wait_finished(handed, worker)
    assert (done.status, done.outcome) == (RunStatus.SUCCEEDED, "handed_over")
    refund = start_run("refund", {"order_id": "ORD-1023", "message": "Shoes too small"}).run
    refund_item = parked(refund)
    item = Approval.objects.get(run=handed, kind="handover")

    journey = Journey.open(browser, url, "desk-hand-over")
    journey.sign_in("approver", then="/approvals/")
    page = journey.page
    card = page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    page.locator(f"#approval-{refund_item.id}").wait_for(timeout=WAIT_MS)
    assert card.locator(".chip").first.inner_text() == "handed over"
    assert message in card.inner_text()  # the customer's words
    assert "ORD-1022" in card.locator(".context-facts").inner_text()  # the order beside it
    journey.shot("inbox-hand-over-and-refund")
    problems = axe_problems(page)
    assert not problems, "\n".join(problems)

    card.locator(".claim-button").click()
    card.locator(".claim.mine").wait_for(timeout=WAIT_MS)
    card.locator("input[name=internal_note]").fill("called Gus, replacement strap sent")
    card.locator("button[value=close]").click()
    card.wait_for(state="detached", timeout=WAIT_MS)
    assert "Closed: the hand-over is done." in page.locator("#decision-log").inner_text()
    item.refresh_from_db()
    assert (item.status, item.resolution, item.decided_by.username) == (
        "resolved",
        "closed",
        "approver",
    )
    assert item.internal_note == "called Gus, replacement strap sent"

    # the inbox's decided tab: closed, with the note in its history
    journey.go("/approvals/decided/?kind=handover")
    decided = page.locator(f"#decided-{item.id}")
    decided.wait_for(timeout=WAIT_MS)
    assert decided.locator(".outcome").inner_text() == "hand-over closed"
    assert "approver closed the hand-over" in decided.locator(".history").inner_text()
    assert "called Gus" in decided.locator(".history .internal-note").inner_text()

    journey.go(f"/runs/{handed.id}/")
    outcome = page.locator("#run-outcome")
    outcome.wait_for(timeout=WAIT_MS)
    assert outcome.inner_text() == "handed over"
    handover = page.locator("#run-handovers .msg-handover")  # in the conversation
    assert handover.is_visible() and "closed by approver" in handover.inner_text()
    assert "called Gus, replacement strap sent" in handover.locator(".internal-note").inner_text()
    page.locator("#engineering > summary").click()  # the step table, one click away
    assert "closed" in page.locator("#steps").inner_text()
    journey.shot("run-page-handed-over")
    problems = axe_problems(page)
    assert not problems, "\n".join(problems)  # the run page with its hand-over, as a whole
    assert Run.objects.get(id=handed.id).outcome == "handed_over"
    journey.check_csp()
