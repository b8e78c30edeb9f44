"""Issue 44 in a real Chromium (Debian's), against daphne and a real worker on PostgreSQL (one of
each for the module), asserting on the DOM and on the outside world (the gateway's ledger, the
replies the customer gets):

1. a lowered refund with a reason: the approver runs the agent from a ticket, lowers its refund
   on the inbox card and writes a reason for the customer; the ledger has exactly the lowered
   cents and the customer's reply carries the approver's words (and never an amount they did
   not ask for);
2. a hand-over that ends on its ticket: a trainee's run hands over; the approver takes it from
   the inbox, which opens the ticket; there they refund part of the order through the refund
   tool (approved in the inbox like any refund), reply to the customer and close it; the ticket
   then shows who closed it and what they did.

axe-core finds no serious or critical issue on any page touched. Screenshots of each key
screen go to var/test-artifacts/e2e/.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from approvals.models import Approval
from support.models import Order, OutboxMessage
from tests.e2e.kit import WAIT_MS, Journey, browser_marks, no_access_problems, parked
from tests.procs import Proc, gateway_refunds, module_web_and_worker, wait_finished

pytestmark = browser_marks()

WORDS = "Only the lid is cracked, so we refund the lid"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[tuple[str, Proc]]:
    """daphne and a qcluster for the module; every refund parks for approval."""
    with module_web_and_worker(
        tmp_path_factory, django_db_blocker, REFUND_APPROVAL_THRESHOLD_CENTS=0
    ) as both:
        yield both


def test_a_lowered_refund_with_a_reason_reaches_the_customer(servers, people, browser):
    url, worker = servers
    order = Order.objects.get(order_id="ORD-1030")
    journey = Journey.open(browser, url, "desk-lowered-with-reason")
    journey.sign_in("approver", then="/tickets/T-1030/")
    page = journey.page
    no_access_problems(journey, journey.page.url)
    page.locator("#run-agent-button").click()
    page.wait_for_url(lambda u: "/runs/" in u, timeout=WAIT_MS)
    run = Run.objects.get(input__ticket_id="T-1030")
    item = parked(run)
    assert item.requested_args["amount_cents"] == order.amount_cents

    journey.go("/approvals/")
    card = page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    no_access_problems(journey, journey.page.url)
    card.locator("details.edit > summary").click()
    card.locator("input[name=arg_amount_cents]").fill("12.50")
    card.locator("input[name=reason]").fill(WORDS)
    journey.shot("lowered-with-reason")
    card.locator("button[value=approve]").click()
    page.locator("#decision-log li").first.wait_for(timeout=WAIT_MS)

    done = wait_finished(run, worker)
    assert (done.status, done.outcome) == (RunStatus.SUCCEEDED, "partially_refunded")
    assert [r["amount_cents"] for r in gateway_refunds(url, "ORD-1030")] == [1250]
    reply = OutboxMessage.objects.get(run_id=run.id).body
    assert "we refunded 12.50 of" in reply and WORDS in reply
    assert "request for" not in reply and "you asked" not in reply.lower()
    # the ticket shows the refund (for this request) and the reply
    journey.go("/tickets/T-1030/")
    page.locator("#refunds .refund-row").first.wait_for(timeout=WAIT_MS)
    assert "12.50 USD" in page.locator("#refunds").inner_text()
    assert WORDS in page.locator("#conversation").inner_text()
    journey.shot("ticket-after-lowered-refund")
    no_access_problems(journey, journey.page.url)
    journey.check_csp()


def test_a_hand_over_ends_on_its_ticket(servers, people, browser):
    url, worker = servers
    message = "The kettle lid cracked, I want my money back"
    handed = start_run(
        "refund",
        {"order_id": "ORD-1031", "ticket_id": "T-1031", "message": message},
        user=people["trainee"],
    ).run
    assert wait_finished(handed, worker).outcome == "handed_over"
    item = Approval.objects.get(run=handed, kind="handover")

    journey = Journey.open(browser, url, "desk-hand-over-ticket")
    journey.sign_in("approver", then="/approvals/")
    page = journey.page
    card = page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    assert card.locator("a.ticket-link").get_attribute("href") == "/tickets/T-1031/"
    no_access_problems(journey, journey.page.url)
    card.locator("button[data-claim=take]").click()  # taking it opens the ticket
    page.wait_for_url(lambda u: u.endswith("/tickets/T-1031/"), timeout=WAIT_MS)
    assert "handed over: taken by approver" in page.locator("#ticket-state").inner_text()
    journey.shot("ticket-taken")
    no_access_problems(journey, journey.page.url)

    # a refund by hand, through the refund tool: it parks for approval like any refund
    page.locator("#refund-amount").fill("25.00")
    page.locator("#refund-reason").fill("We refund the cracked lid.")
    page.locator("#handover-refund button[type=submit]").click()
    page.locator(".messages, [role=status], .msg-success").first.wait_for(timeout=WAIT_MS)
    by_hand = Run.objects.get(input__staff_refund__amount_cents=2500)
    assert by_hand.created_by == people["approver"]
    refund_item = parked(by_hand)
    journey.go("/approvals/")
    refund_card = page.locator(f"#approval-{refund_item.id}")
    refund_card.wait_for(timeout=WAIT_MS)
    refund_card.locator("button[value=approve]").click()
    page.locator("#decision-log li").first.wait_for(timeout=WAIT_MS)
    assert wait_finished(by_hand, worker).outcome == "partially_refunded"
    assert [r["amount_cents"] for r in gateway_refunds(url, "ORD-1031")] == [2500]

    # back on the ticket: the refund is this request's; reply, then close with what was done
    journey.go("/tickets/T-1031/")
    assert "for this request" in page.locator("#refunds").inner_text()
    page.locator("#reply-text").fill("Hi, the lid is refunded; a new one is on its way.")
    page.locator("#handover-reply button[type=submit]").click()
    page.wait_for_url(lambda u: u.endswith("/tickets/T-1031/"), timeout=WAIT_MS)
    page.locator("#close-note").fill("refunded the lid (25.00), replied, new lid sent")
    page.locator("#handover-close button[type=submit]").click()
    page.locator(".handover-closed").wait_for(timeout=WAIT_MS)
    assert "hand-over closed by approver" in page.locator("#ticket-state").inner_text()
    assert page.locator("#ticket-status").inner_text() == "resolved by approver"
    closed = page.locator(".handover-closed").inner_text()
    assert "Closed by approver" in closed and "new lid sent" in closed
    conversation = page.locator("#conversation").inner_text()
    assert "a new one is on its way" in conversation and "closed the hand-over" in conversation
    assert "waiting for a colleague" not in page.content()
    journey.shot("ticket-hand-over-closed")
    no_access_problems(journey, journey.page.url)
    item.refresh_from_db()
    assert (item.status, item.decided_by) == ("resolved", people["approver"])
    assert OutboxMessage.objects.filter(ticket__ticket_id="T-1031", sent_by="approver").count() == 1
    # the queue's open tickets leave it out; the resolved ones list it, with who resolved it
    page.goto(f"{url}/tickets/?q=T-1031")
    assert page.locator('tr[data-ticket="T-1031"]').count() == 0
    page.goto(f"{url}/tickets/?status=resolved&q=T-1031")
    row = page.locator('tr[data-ticket="T-1031"]').inner_text()
    assert "resolved by approver" in row
    journey.check_csp()
