"""The desk in plain words and without dead ends, in a real Chromium (Debian's) against daphne and a
real worker on PostgreSQL (issue 44, items 3 and 6), asserting on the DOM and the database; axe-core
finds nothing serious or critical on each page touched, and screenshots go to
var/test-artifacts/e2e/ (README's docs/screenshots/ are copies):

1. an approver signs in and lands on the ticket queue; runs the agent on a ticket; the run page
   says the agent is working before its first event, then what it waits for as a sentence ("Waiting
   for an approver: refund 327.32 USD to Jun Sato"), with no step numbers, keys or JSON outside the
   engineering detail; another approver decides and the banner follows to the end without a reload;
2. Stop on a run waiting for an approver asks first, listing the refund it withdraws; the run ends
   "Stopped by approver" and its refund reads "withdrawn";
3. an approver types a lower amount and a reason on a card; another approver approves the item
   meanwhile: the card stays, says who decided what, and keeps the typed values;
4. the decided view and a hand-over's item page: how long an item waited, in words.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval
from support.models import Order
from tests.e2e.kit import PASSWORD, WAIT_MS, Journey, browser_marks, no_access_problems, parked
from tests.procs import module_web_and_worker, wait_until

pytestmark = browser_marks()

# slow enough tokens that the run page opens while the agent's first turn streams
ENV = {"REFUND_APPROVAL_THRESHOLD_CENTS": 0, "SCRIPTED_MODEL_DELAY_MS": 25}
ENGINEERING = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|_cents|\{\"|step #\d|refund:ORD-|concurrency key"
    r"|issue_refund|order_id",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    with module_web_and_worker(tmp_path_factory, django_db_blocker, **ENV) as (url, _):
        yield url


def plain(journey: Journey, where: str) -> None:
    """What the page shows (innerText: a closed <details> shows only its summary) holds no
    engineering words."""
    shown = journey.page.inner_text("main")
    found = [m.group(0) for m in ENGINEERING.finditer(shown)]
    assert not found, f"engineering words on {where}: {found}"


def banner(journey: Journey) -> str:
    return re.sub(r"\s+", " ", journey.page.inner_text("#run-banner")).strip()


def test_from_signing_in_to_a_finished_refund_the_run_page_says_where_it_stands(
    servers, people, browser
):
    order = Order.objects.get(order_id="ORD-1050")
    journey = Journey.open(browser, servers, "desk-words")
    page = journey.page
    journey.go("/")  # the start page: sign in, then land on the queue (not the runs)
    page.fill("input[name=username]", "approver")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/tickets/$"), timeout=WAIT_MS)
    page.wait_for_selector("tr[data-ticket=T-1050]")
    assert re.search(r"just now|min ago|h ago", page.inner_text("tr[data-ticket=T-1050]"))
    no_access_problems(journey, "the ticket queue")
    plain(journey, "the ticket queue")

    journey.go("/tickets/T-1050/")
    page.click("#run-agent-button")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"), timeout=WAIT_MS)
    # from the first moment, before the agent's first word: it is working (not an empty page)
    first = page.get_attribute("#run-banner", "data-tone")
    assert first in ("working", "waiting"), first
    if first == "working":
        assert re.match(r"The refund agent is (starting|working) on T-1050", banner(journey))
    assert page.locator(".messages").count() == 0  # no flash that outlives the run
    run = Run.objects.get(input__ticket_id="T-1050")
    item = parked(run)
    page.wait_for_function(
        "() => document.getElementById('run-banner').dataset.tone === 'waiting'"
        " && document.querySelector('#approval-card .approval-card')",
        timeout=WAIT_MS,
    )
    expected = f"Waiting for an approver: refund {order.amount} to {order.customer_name}"
    assert banner(journey).startswith(expected), banner(journey)
    card = page.inner_text("#approval-card")
    assert "Refund 327.32 USD to Jun Sato" in card and "Step #" not in card
    assert page.locator("#approval-card details.call-detail").get_attribute("open") is None
    plain(journey, "the run page, waiting")
    no_access_problems(journey, "the run page, waiting for an approver")
    journey.shot("run-waiting")

    # another approver decides: the page follows to the end, no reload
    decisions.decide(item.id, "approve", people["approver2"], version=item.version)
    page.wait_for_function(
        "() => document.getElementById('run-banner').dataset.tone === 'done'", timeout=WAIT_MS
    )
    page.wait_for_function(
        "() => document.getElementById('run-banner').textContent.includes('Finished: refunded')",
        timeout=WAIT_MS,
    )
    assert "working" not in banner(journey)
    decision = page.inner_text("#approval-card .decision-line")
    assert "approved by approver2" in decision and "just now" in decision
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED
    plain(journey, "the finished run page")
    no_access_problems(journey, "the finished run page")
    journey.shot("run-finished")
    journey.check_csp()


def test_stop_asks_before_it_withdraws_a_refund_and_the_refund_then_reads_withdrawn(
    servers, people, browser
):
    order = Order.objects.get(order_id="ORD-1044")
    run = start_run(
        "refund",
        {"order_id": order.order_id, "ticket_id": "T-1044", "message": "They stopped working"},
        user=people["approver"],
    ).run
    item = parked(run)
    journey = Journey.open(browser, servers, "desk-stop")
    page = journey.page
    journey.sign_in("approver", then=f"/runs/{run.id}/")
    page.wait_for_selector("#run-banner[data-tone=waiting]")
    # one Stop, explained; no word about operators' cancelling for the run's own starter
    assert page.locator("#run-actions summary", has_text="Stop").count() == 1
    assert "Stop ends the run now" in page.inner_text("#stop-help")
    assert "Only operators" not in page.inner_text("#run-actions")
    assert page.locator("button", has_text="Cancel run").count() == 0
    page.click("#stop-confirm > summary")
    listed = page.inner_text("#stop-confirm .withdraws")
    assert f"Refund {order.amount} to {order.customer_name}" in listed
    no_access_problems(journey, "the stop's confirmation")
    journey.shot("stop-confirm")
    page.fill("#stop-reason-input", "the customer called: sorted by phone")
    page.click("#stop-confirm button[type=submit]")
    page.wait_for_selector("#run-banner[data-tone=stopped]", timeout=WAIT_MS)
    assert banner(journey).startswith(
        "Stopped by approver: the customer called: sorted by phone"
    ), banner(journey)
    line = page.locator("#approval-card .decision-line")
    assert line.locator(".chip").inner_text() == "withdrawn"
    assert "s-withdrawn" in line.locator(".chip").get_attribute("class")
    assert "resolved" not in line.inner_text() and "stopped by approver" in line.inner_text()
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("resolved", "withdrawn")
    assert Run.objects.get(id=run.id).stop_reason == "stopped"
    plain(journey, "the stopped run page")
    no_access_problems(journey, "the stopped run page")
    journey.shot("stopped")
    journey.check_csp()


def test_a_card_decided_by_someone_else_while_you_type_says_so_and_keeps_your_values(
    servers, people, browser
):
    run = start_run(
        "refund",
        {"order_id": "ORD-1041", "ticket_id": "T-1041", "message": "The blender broke"},
        user=people["lead"],
    ).run
    item = parked(run)
    journey = Journey.open(browser, servers, "desk-decided-elsewhere")
    page = journey.page
    journey.sign_in("approver", then="/approvals/")
    card = page.locator(f"#approval-{item.id}")
    card.wait_for(timeout=WAIT_MS)
    plain(journey, "the inbox")
    card.locator("details.edit > summary").click()
    amount = card.locator("input[name=arg_amount_cents]")
    amount.fill("35.00")
    card.locator("input[name=reason]").fill("A partial refund for the broken lid")
    # approver2 approves as asked, elsewhere; the inbox's poll brings it within seconds
    decisions.decide(item.id, "approve", people["approver2"], version=item.version)
    note = card.locator(".decided-elsewhere-note")
    note.wait_for(timeout=WAIT_MS)
    page.wait_for_function(
        "(id) => document.querySelector(`#approval-${id} .decided-by-other`)"
        "?.textContent.includes('approver2')",
        arg=item.id,
        timeout=WAIT_MS,
    )
    said = note.inner_text()
    assert "Approved by approver2" in said and "Nothing you typed was sent" in said, said
    assert amount.input_value() == "35.00"  # what you typed is still there
    assert card.locator("input[name=reason]").input_value() == "A partial refund for the broken lid"
    assert card.locator("button[value=approve]").is_disabled()
    page.wait_for_timeout(2500)  # the next poll keeps it too
    assert card.is_visible() and amount.input_value() == "35.00"
    no_access_problems(journey, "the inbox with a card decided elsewhere")
    journey.shot("decided-elsewhere")
    card.locator(".dismiss-kept").click()
    card.wait_for(state="detached", timeout=WAIT_MS)
    journey.check_csp()


def test_the_decided_view_and_a_handover_say_how_long_in_words(servers, people, browser):
    handover = start_run(
        "refund",
        {"order_id": "ORD-1033", "ticket_id": "T-1033", "message": "The jacket leaks"},
        user=people["trainee"],
    ).run
    item = wait_until(
        lambda: Approval.objects.filter(run=handover, kind="handover").first(), timeout=120
    )
    refund = start_run(
        "refund",
        {"order_id": "ORD-1032", "ticket_id": "T-1032", "message": "The lamp never came"},
        user=people["approver"],
    ).run
    asked = parked(refund)
    decisions.decide(
        asked.id, "reject", people["approver2"], version=asked.version, reason="Delivered: signed"
    )
    journey = Journey.open(browser, servers, "desk-decided-words")
    page = journey.page
    journey.sign_in("approver", then=f"/approvals/{item.id}/")
    page.wait_for_selector(f"#approval-{item.id}")
    head = page.inner_text(f"#approval-{item.id} .card-head")
    assert "hands the request over to a person" in head and "hand_over" not in head
    assert re.search(r"waiting \d+ (s|min)", head), head
    plain(journey, "a hand-over's item page")
    no_access_problems(journey, "a hand-over's item page")
    journey.shot("handover-item")

    journey.go("/approvals/decided/")
    page.wait_for_selector(".decided-item")
    first = page.inner_text(".decided-item >> nth=0")
    assert re.search(r"after waiting \d+ (s|min)", first), first
    plain(journey, "the decided view")
    no_access_problems(journey, "the decided view")
    journey.shot("decided")
    journey.check_csp()
