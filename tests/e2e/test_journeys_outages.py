"""The product's journeys through a server's outage, in a real Chromium (Debian's), against
daphne and a real worker on PostgreSQL, with the Content Security Policy checked on every page:

1. the lead finds a failed run in the list, reads why, retries it once the gateway is back;
2. the web server restarts while a run page is open: the page reconnects, the text is whole.

Each starts and stops servers of its own (the journeys on servers that stay up share theirs:
test_journeys.py). Screenshots of the key screens go under var/test-artifacts/e2e/.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from django.db import connections

from agentruns.models import RunStatus
from agentruns.services import start_run
from tests.e2e.kit import WAIT_MS, Journey, browser_marks, settled, watch_run_page_to_the_end
from tests.procs import free_port, start_web, start_worker, wait_until

pytestmark = browser_marks()


@pytest.fixture
def procs():
    started: list = []
    yield started
    for proc in started:
        proc.kill()
    # Playwright's sync API runs an event loop in this thread: close this thread's connection
    connections.close_all()


def test_a_failed_run_found_read_retried_and_succeeded(tmp_path, people, browser, procs):
    web, url = start_web(tmp_path, REFUND_GATEWAY_FAIL=1)  # the gateway is down
    port = int(url.rsplit(":", 1)[1])
    procs += [web, start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway")]
    run = start_run("refund", {"order_id": "ORD-1002", "message": "It broke, refund $25"}).run
    wait_until(lambda: settled(run.id), timeout=120, message="the run to fail")

    journey = Journey.open(browser, url, "failed")
    journey.sign_in("lead")
    page = journey.page
    page.click("nav >> text=Failed")
    row = page.locator(f"tr:has(a[href='/runs/{run.id}/'])")
    row.wait_for(timeout=WAIT_MS)
    assert "gateway answered 503" in row.inner_text()
    journey.shot("failed-list")
    row.locator(f"a[href='/runs/{run.id}/']").first.click()
    page.wait_for_selector("#run-status.s-failed", timeout=WAIT_MS)
    assert "gateway answered 503" in page.inner_text("#stop-reason, .facts")
    journey.shot("failed-run")

    web.kill()  # the outage ends: the gateway (this same server) comes back healthy
    healthy, _ = start_web(tmp_path, port=port)
    procs.append(healthy)
    page.reload()
    page.click("form.act-retry button")
    page.wait_for_selector("#run-status.s-succeeded", timeout=WAIT_MS)
    done = wait_until(lambda: settled(run.id), timeout=60, message="the run to end")
    assert done.status == RunStatus.SUCCEEDED
    page.wait_for_selector("#conn[data-state=finished]", timeout=WAIT_MS)
    journey.shot("retried-succeeded")
    refunds = httpx.get(url + "/gateway/refunds", params={"order_id": "ORD-1002"}).json()
    assert [r["amount_cents"] for r in refunds["refunds"]] == [2500]
    journey.check_csp()


def test_the_run_page_reconnects_after_a_web_restart(tmp_path, people, browser, procs):
    web_port, gateway_port = free_port(), free_port()
    env = {
        "SCRIPTED_MODEL_DELAY_MS": 50,  # slow enough to restart mid-stream
        "REFUND_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}/gateway",
        "REFUND_GATEWAY_DELAY_MS": 800,
    }
    gateway, _ = start_web(tmp_path, port=gateway_port, **env)
    web, url = start_web(tmp_path, port=web_port, **env)
    procs += [gateway, web, start_worker(tmp_path, **env)]
    journey = Journey.open(browser, url, "restart")
    journey.sign_in("lead")
    run = start_run("refund", {"order_id": "ORD-1007", "message": "Never arrived."}).run
    journey.go(f"/runs/{run.id}/")
    page = journey.page
    page.wait_for_selector("#conn[data-state=live]", timeout=WAIT_MS)
    page.wait_for_function(
        "() => document.getElementById('live-text').textContent.length > 30", timeout=WAIT_MS
    )
    journey.shot("streaming")

    web.kill()
    restarted: list = []
    thread = threading.Thread(
        target=lambda: restarted.append(start_web(tmp_path, port=web_port, **env)[0]), daemon=True
    )
    thread.start()
    page.wait_for_selector("#conn[data-state=reconnecting]", timeout=WAIT_MS)
    journey.shot("reconnecting")
    thread.join(timeout=120)
    procs += restarted
    assert restarted, "the web server came back"
    done = watch_run_page_to_the_end(journey, run)
    assert done.status == RunStatus.SUCCEEDED
    journey.shot("whole-text")
    journey.check_csp()
