"""The support desk in a real Chromium (Debian's), against daphne and a real worker on PostgreSQL
(issue 34): each journey asserts on the DOM, checks the Content Security Policy, runs axe-core on
its pages (no serious or critical issue) and saves screenshots under var/test-artifacts/e2e/.

1. from the ticket queue to a finished refund without typing JSON: search, open the ticket, run
   the agent (a double click starts one run), approve in the inbox, watch the run page end with
   the reply sent, see the refund on the ticket and the decision in the inbox's decided view;
2. the start form's fields, and a viewer's 403 in the layout;
3. a failed run for support staff: who can act, the counts following by themselves, the lead's
   retry counting its attempts afresh.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from playwright.sync_api import expect

from agentruns.models import Run, RunStatus, Step
from agentruns.services import execute_inline, start_run
from approvals import services as approvals
from approvals.models import Approval
from support.models import Order, Ticket
from tests.e2e.kit import WAIT_MS, Journey, browser_marks, no_access_problems
from tests.procs import module_web_and_worker, wait_until

pytestmark = browser_marks()

ENV = {"REFUND_APPROVAL_THRESHOLD_CENTS": 0, "SCRIPTED_MODEL_DELAY_MS": 5}


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup, django_db_blocker):
    """One daphne (the pages, the API, the refund gateway) and one worker for the module."""
    with module_web_and_worker(tmp_path_factory, django_db_blocker, **ENV) as (url, _):
        yield url


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def refunds_of(url: str, order_id: str) -> list[int]:
    body = httpx.get(url + "/gateway/refunds", params={"order_id": order_id}).json()
    return [r["amount_cents"] for r in body["refunds"]]


def test_from_the_ticket_queue_to_a_finished_refund_without_json(web, people, browser):
    ticket = Ticket.objects.select_related("order").get(ticket_id="T-1004")
    order = ticket.order
    journey = Journey.open(browser, web, "desk")
    page = journey.page
    journey.sign_in("approver", then="/tickets/")
    page.wait_for_selector("tr[data-ticket]")
    no_access_problems(journey, "the ticket queue")
    journey.shot("queue")

    # find the customer's ticket by their name
    page.fill("#ticket-q", order.customer_name.split()[1])
    page.press("#ticket-q", "Enter")
    page.wait_for_url(re.compile(r"q="))
    row = page.locator(f"tr[data-ticket={ticket.ticket_id}]")
    row.wait_for(timeout=WAIT_MS)
    assert order.customer_name in row.inner_text() and order.amount in row.inner_text()
    journey.shot("search")
    row.locator("a").first.click()

    page.wait_for_selector("#order")
    assert order.item in page.inner_text("#order") and order.amount in page.inner_text("#order")
    assert page.inner_text("#refunds") == "No refunds yet."
    assert ticket.body in page.inner_text("#conversation")
    no_access_problems(journey, "the ticket page")
    journey.shot("ticket")

    # a double click on the button, then the same form sent again (a resend, a back-and-click):
    # one run, with the ticket's input (no JSON typed anywhere)
    form = {
        name: page.get_attribute(f"#start-on-ticket input[name={name}]", "value")
        for name in ("csrfmiddlewaretoken", "form_token")
    }
    page.dblclick("#run-agent-button")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"), timeout=WAIT_MS)
    first = page.url
    again = page.request.post(
        f"{web}/tickets/T-1004/run/", form=form, headers={"Referer": f"{web}/tickets/T-1004/"}
    )
    assert again.ok and again.url == first  # redirected to the same run
    runs = Run.objects.filter(input__ticket_id=ticket.ticket_id)
    assert runs.count() == 1
    run = runs.get()
    assert run.input == {"order_id": order.order_id, "ticket_id": "T-1004", "message": ticket.body}
    page.wait_for_selector("#approval-card .approval-card", timeout=WAIT_MS)
    assert ticket.body in page.inner_text("#customer-message")
    no_access_problems(journey, "the run page, waiting for approval")
    journey.shot("run-waiting")

    # the inbox, from the navigation: approve as asked
    page.click("nav >> text=Inbox")
    card = page.locator(f"#approval-{run.approvals.get().id}")
    card.wait_for(timeout=WAIT_MS)
    no_access_problems(journey, "the inbox")
    journey.shot("inbox")
    card.locator("button[value=approve]").click()
    card.wait_for(state="detached", timeout=WAIT_MS)

    journey.go(f"/runs/{run.id}/")
    page.wait_for_selector("#conn[data-state=finished]", timeout=WAIT_MS)
    done = wait_until(lambda: Run.objects.get(id=run.id).is_terminal and Run.objects.get(id=run.id))
    assert done.status == RunStatus.SUCCEEDED
    reply = page.locator("#run-replies .msg-reply")
    reply.wait_for(timeout=WAIT_MS)
    # the page swaps its server-rendered parts in 300 ms after the run's last event (debounced,
    # runstream.js), so the socket may say "finished" while the reply still says "sending"
    expect(reply.locator(".chip")).to_have_text("sent", timeout=WAIT_MS)
    assert order.amount.split()[0] in reply.locator(".reply-text").inner_text()
    assert page.locator("#engineering").get_attribute("open") is None  # one click away
    no_access_problems(journey, "the finished run page")
    journey.shot("run-finished")
    assert refunds_of(web, order.order_id) == [order.amount_cents]

    # back on the ticket: the refund so far, the run with its status
    journey.go(f"/tickets/{ticket.ticket_id}/")
    assert page.locator("#refunds .refund-row").count() == 1
    assert "fully refunded" in page.inner_text("#refunded-total")
    assert page.inner_text(f"#ticket-runs tr[data-run-id='{run.id}'] .chip") == "succeeded"
    assert "Reply sent to the customer" in page.inner_text("#conversation")
    journey.shot("ticket-after")

    # the decision in the inbox's decided view, found by the order
    journey.go("/approvals/decided/")
    page.fill("input[name=q]", order.order_id)
    page.press("input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"q=ORD"))
    item = page.locator(".decided-item")
    item.first.wait_for(timeout=WAIT_MS)
    assert item.count() == 1
    assert "approver approved" in re.sub(r"\s+", " ", item.locator(".history").inner_text())
    no_access_problems(journey, "the inbox's decided view")
    journey.shot("decided")
    journey.check_csp()


def test_the_start_form_has_fields_and_a_viewer_gets_a_page_of_the_layout(web, people, browser):
    journey = Journey.open(browser, web, "start-form")
    page = journey.page
    journey.sign_in("trainee", then="/runs/new/")
    page.wait_for_selector("#f-order_id")
    assert page.get_attribute("#f-order_id", "maxlength") == "20"
    assert page.locator("label[for=f-order_id] .required").count() == 1
    assert page.locator("details.advanced").get_attribute("open") is None
    page.fill("#f-order_id", "ORD-1021")
    page.fill("#f-message", "The backpack strap tore off.")
    no_access_problems(journey, "the start form")
    journey.shot("start-form")
    page.click("#start-form button[type=submit]")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"), timeout=WAIT_MS)
    run = Run.objects.get(input__order_id="ORD-1021")
    assert run.input == {"order_id": "ORD-1021", "message": "The backpack strap tore off."}
    assert page.inner_text("#run-input").split() == ["Order", "ORD-1021"]  # in words

    viewer = Journey.open(browser, web, "forbidden")
    viewer.sign_in("viewer")
    viewer.go("/runs/new/")
    viewer.page.wait_for_selector("#error-page[data-status='403']")
    assert "Your account may not do this" in viewer.page.inner_text("h1")
    assert viewer.page.locator("nav >> text=Runs").count() == 1  # the layout, with its navigation
    no_access_problems(viewer, "the 403 page")
    viewer.shot("403")
    viewer.go("/tickets/T-0/")
    viewer.page.wait_for_selector("#error-page[data-status='404']")
    viewer.shot("404")
    journey.check_csp()
    viewer.check_csp()


@contextmanager
def gateway_answering_503() -> Iterator[str]:
    """A payment gateway that is up but refuses every refund (503): its URL."""

    class Down(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Down)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/gateway"
    finally:
        server.shutdown()


def test_a_failed_run_for_support_staff(web, people, browser, settings):
    order = Order.objects.get(order_id="ORD-1030")
    # executed here, against a gateway that refuses every refund: its refund fails for good
    # (the module's worker, whose gateway is healthy, takes the run once the lead retries it)
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 10**9
    settings.AGENTRUNS_RETRY_SLEEP_MAX_SECONDS = 60  # back off in this process, not the queue
    with gateway_answering_503() as down:
        settings.REFUND_GATEWAY_URL = down
        run, _ = execute_inline("refund", {"order_id": order.order_id, "message": "Never came."})
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED, run.error
    refund = Step.objects.get(run=run, tool="issue_refund")
    assert refund.attempts == 3

    approver = Journey.open(browser, web, "failed-approver")
    page = approver.page
    approver.sign_in("approver", then=f"/runs/{run.id}/")
    page.wait_for_selector("#run-status.s-failed")
    assert page.locator("#run-actions form").count() == 0
    assert page.inner_text("#who-can").startswith("Only operators can retry this run")
    assert "gateway answered 503" in page.inner_text("#stop-reason")
    no_access_problems(approver, "a failed run page")
    approver.shot("who-can-act")
    # the navigation's counts follow without a reload: a run parks for approval meanwhile
    waiting, pending = (
        int(page.inner_text(f"#nav-{k}").split()[-1]) for k in ("waiting", "pending")
    )
    parked = start_run("refund", {"order_id": "ORD-1031", "message": "hello"}).run
    wait_until(lambda: Run.objects.get(id=parked.id).status == RunStatus.WAITING, timeout=60)
    page.wait_for_function(
        """([w, p]) => document.querySelector('#nav-waiting .count').textContent.trim() === w
            && document.getElementById('nav-pending').textContent.trim() === p""",
        arg=[str(waiting + 1), str(pending + 1)],
        timeout=20_000,
    )

    lead = Journey.open(browser, web, "failed-lead")
    lead.sign_in("lead", then=f"/runs/{run.id}/")
    lead.page.click("#engineering > summary")
    row = lead.page.locator(f"#step-{refund.index} .attempts-count")
    assert row.inner_text().startswith("3 of 3")
    lead.page.click("form.act-retry button")  # the worker's gateway is the healthy one
    lead.page.wait_for_selector("#run-status:not(.s-failed)", timeout=WAIT_MS)
    # right after the retry the policy's budget counts afresh (the old code: "3 of 3", "4 of 3")
    counted, total = re.match(r"(\d) of 3 · (\d) in all", squash(row.inner_text())).groups()
    assert int(total) == int(counted) + 3 and int(counted) <= 1
    # (the worker's refunds need approval: the retried call asks for it, the lead gives it)
    item = wait_until(
        lambda: Approval.objects.filter(run=run, status="pending").first(), timeout=60
    )
    approvals.decide(item.id, "approve", people["lead"], version=item.version)
    lead.page.wait_for_selector("#run-status.s-succeeded", timeout=WAIT_MS)
    lead.page.reload()
    lead.page.wait_for_selector("#engineering[open]")  # it stays open for who opened it
    assert squash(row.inner_text()).startswith("1 of 3 · 4 in all")
    started = lead.page.locator("#events li", has_text=f"running step #{refund.index} ")
    last = squash(started.last.inner_text())
    assert "attempt 4" in last and "gateway" not in last  # its own event: no old error
    parked_again = lead.page.locator(
        "#events li", has_text=f"waiting_approval step #{refund.index}"
    )
    assert "gateway" not in parked_again.last.inner_text()  # nor when it waits for a person
    lead.shot("retried")
    assert refunds_of(web, order.order_id) == [order.amount_cents]
    approver.check_csp()
    lead.check_csp()
