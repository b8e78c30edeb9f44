"""The run page in a real Chromium against daphne on PostgreSQL with a real worker.

Text must appear incrementally while the scripted model streams; when the web process is killed
and started again the page must say "reconnecting" and then carry on by itself; at the end the
conversation on the page is the database's model text, each turn exactly once, and the output
box is the run's output.
"""

from __future__ import annotations

import threading

import httpx
from django.db import connections

from agentruns.models import Run, RunEvent, Step
from agentruns.tokens import create_token
from tests.e2e.kit import browser_marks, logged_in_page, set_browser_password
from tests.procs import free_port, start_run_over_http, start_web, start_worker, wait_until

pytestmark = browser_marks()


# Records, from the first paint on, every length the conversation text had and every state the
# connection indicator showed: evidence of incremental text and of the reconnect, not timing.
RECORDER = """
window.__textLengths = [];
window.__connStates = [];
document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live-text");
  const conn = document.getElementById("conn");
  if (!live || !conn) return;
  const note = () => {
    const n = live.textContent.length;
    const seen = window.__textLengths;
    if (seen[seen.length - 1] !== n) seen.push(n);
    const s = conn.dataset.state;
    const states = window.__connStates;
    if (states[states.length - 1] !== s) states.push(s);
  };
  note();
  new MutationObserver(note).observe(live, {childList: true, subtree: true, characterData: true});
  new MutationObserver(note).observe(conn, {attributes: true, childList: true, characterData: true});
});
"""


def assert_page_shows_the_run(page, run: Run) -> None:
    turns = page.eval_on_selector_all("#live-text .turn", "els => els.map(e => e.textContent)")
    model_texts = list(
        Step.objects.filter(run=run, kind="model").order_by("index").values_list("text", flat=True)
    )
    assert turns == model_texts  # every turn once, in order, nothing doubled at any seam
    assert page.inner_text("#live-text").count(run.output) == 1
    assert page.inner_text("#run-output").strip() == run.output.strip()
    assert page.get_attribute("#run", "data-last-seq") == str(run.last_seq)
    assert page.inner_text("#run-status") == run.status
    # the step table was updated in place (no reload): one row per step, each with its final
    # status (the table is refetched shortly after the step events, so wait for it to settle)
    statuses = list(run.steps.order_by("index").values_list("status", flat=True))
    page.wait_for_function(
        """expected => {
            const chips = [...document.querySelectorAll('#steps tr[id^=step-]')]
                .map(row => row.querySelector('.chip').textContent.trim());
            return JSON.stringify(chips) === JSON.stringify(expected);
        }""",
        arg=statuses,
        timeout=60_000,
    )


def test_run_page_streams_and_survives_a_server_restart(tmp_path, lead, seeded, browser, settings):
    set_browser_password(lead, settings)
    token = create_token(lead)
    web_port, gateway_port = free_port(), free_port()
    env = {
        "SCRIPTED_MODEL_DELAY_MS": "60",  # slow enough that a person (and the test) sees it type
        "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",
        "REFUND_GATEWAY_URL": f"http://127.0.0.1:{gateway_port}/gateway",
        "REFUND_GATEWAY_DELAY_MS": "1000",
        "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
    }
    gateway, _ = start_web(tmp_path, port=gateway_port, **env)
    web, base_url = start_web(tmp_path, port=web_port, **env)
    webs = [web]
    worker = start_worker(tmp_path, **env)
    try:
        page = logged_in_page(browser, base_url, "lead", RECORDER)

        run_id = start_run_over_http(
            base_url, token, {"order_id": "ORD-1007", "message": "Never arrived."}
        )
        page.goto(f"{base_url}/runs/{run_id}/")
        page.wait_for_selector("#conn[data-state=live]", timeout=60_000)
        # the text grows while we watch
        page.wait_for_function(
            "() => document.getElementById('live-text').textContent.length > 30", timeout=120_000
        )

        # restart the web process mid-run: kill now, start again in the background
        webs[0].kill()
        restart = threading.Thread(
            target=lambda: webs.append(start_web(tmp_path, port=web_port, **env)[0]), daemon=True
        )
        restart.start()
        page.wait_for_selector("#conn[data-state=reconnecting]", timeout=60_000)
        assert "reconnecting" in page.inner_text("#conn")
        restart.join(timeout=120)
        assert len(webs) == 2, "the web server came back"

        page.wait_for_selector("#conn[data-state=finished]", timeout=180_000)
        run = wait_until(
            lambda: Run.objects.filter(id=run_id, status="succeeded").first(),
            timeout=60,
            message="run succeeded",
        )
        assert_page_shows_the_run(page, run)

        lengths = page.evaluate("window.__textLengths")
        states = page.evaluate("window.__connStates")
        growth = [n for n in lengths if n > 0]
        assert len(growth) >= 5, f"text should appear piece by piece, saw lengths {lengths}"
        assert growth == sorted(growth), "text only grows (superseded text aside, none here)"
        assert "reconnecting" in states and states.index("reconnecting") > states.index("live")
        assert states[-1] == "finished"
        print("text lengths", lengths, "conn states", states)
    finally:
        worker.stop()
        for proc in webs:
            proc.stop()
        gateway.stop()
        # Playwright's sync API runs an event loop in this thread, so Django's per-context
        # connection used above is not the one pytest-django closes: close it here
        connections.close_all()


def test_approval_card_and_superseded_text_on_the_live_page(
    tmp_path, lead, seeded, browser, settings
):
    """The run parks for approval: the card appears live and goes when decided. The worker also
    dies mid-stream once in every model step: the page drops that attempt's partial text."""
    set_browser_password(lead, settings)
    token = create_token(lead)
    port = free_port()
    env = {
        "SCRIPTED_MODEL_DELAY_MS": "20",
        "REFUND_APPROVAL_THRESHOLD_CENTS": "0",
        "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
        "REFUND_GATEWAY_URL": f"http://127.0.0.1:{port}/gateway",
        "AGENTRUNS_FAILPOINTS": "model_streaming:refund=crash_once",
        "AGENTRUNS_FAILPOINT_DIR": str(tmp_path / "failpoints"),
    }
    web, base_url = start_web(tmp_path, port=port, **env)
    worker = start_worker(tmp_path, **env)
    try:
        page = logged_in_page(browser, base_url, "lead", RECORDER)
        run_id = start_run_over_http(
            base_url, token, {"order_id": "ORD-1011", "message": "Wrong size."}
        )
        page.goto(f"{base_url}/runs/{run_id}/")
        # no reload: the card arrives through the stream when the run parks
        page.wait_for_selector("#approval-card .approval-card", timeout=120_000)
        assert "Refund " in page.inner_text("#approval-card")  # the call in words
        page.wait_for_selector("#run-status.s-waiting", timeout=60_000)
        assert page.get_attribute("#conn", "data-state") == "live"  # waiting is not finished

        pending = httpx.get(
            f"{base_url}/api/approvals?status=pending", headers={"Authorization": f"Bearer {token}"}
        ).json()["approvals"]
        approval = next(a for a in pending if a["run_id"] == run_id)
        decided = httpx.post(
            f"{base_url}/api/approvals/{approval['id']}",
            json={"decision": "approve"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert decided.status_code == 200, decided.text

        page.wait_for_selector("#conn[data-state=finished]", timeout=180_000)
        page.wait_for_function(
            "() => !document.querySelector('#approval-card .approval-card')", timeout=60_000
        )
        run = wait_until(
            lambda: Run.objects.filter(id=run_id, status="succeeded").first(),
            timeout=60,
            message="run succeeded",
        )
        assert_page_shows_the_run(page, run)  # no superseded text left, nothing doubled
        assert RunEvent.objects.filter(run=run, type="model.superseded").count() >= 2
        lengths = page.evaluate("window.__textLengths")
        assert any(b < a for a, b in zip(lengths, lengths[1:], strict=False)), (
            f"superseded text should have been removed live, saw lengths {lengths}"
        )
    finally:
        worker.stop()
        web.stop()
        connections.close_all()
