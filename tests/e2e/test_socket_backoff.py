"""The run page in a real Chromium, when the server has no socket slot for its user: it waits
longer and longer between tries (4013 "try again later"), instead of reconnecting several times
a second, and connects by itself once a slot is free (stream/access/slots.py, agentruns/static/agentruns/runstream.js).
"""

from __future__ import annotations

import json
import time

from websockets.sync.client import connect

from agentruns.models import Run
from agentruns.tokens import create_token
from tests.e2e.kit import browser_marks, logged_in_page, set_browser_password
from tests.procs import start_web, wait_until

pytestmark = browser_marks()

STATES = """
window.__connStates = [];
document.addEventListener("DOMContentLoaded", () => {
  const conn = document.getElementById("conn");
  if (!conn) return;
  new MutationObserver(() => window.__connStates.push(conn.dataset.state))
    .observe(conn, {attributes: true, childList: true, characterData: true});
});
"""


def test_the_run_page_backs_off_while_the_user_has_no_socket_slot(
    tmp_path, lead, browser, settings
):
    set_browser_password(lead, settings)
    run = Run.objects.create(agent="script", input={}, status="running", created_by=lead)
    web, url = start_web(tmp_path, AGENTRUNS_SOCKETS_PER_USER=1)
    ws_path = f"/ws/runs/{run.id}/"
    auth = {"Authorization": f"Bearer {create_token(lead)}"}
    try:
        with connect(
            url.replace("http", "ws") + ws_path, origin=url, additional_headers=auth
        ) as held:
            held.send(json.dumps({"type": "ping"}))
            assert json.loads(held.recv(timeout=10))["type"] == "pong"  # lead's one slot
            page = logged_in_page(browser, url, "lead", STATES, next_path=f"/runs/{run.id}/")
            wait_until(lambda: web.log().count(f"WSCONNECTING {ws_path}") >= 2, timeout=60)
            tries_before = web.log().count(f"WSCONNECTING {ws_path}")
            time.sleep(12)
            tries = web.log().count(f"WSCONNECTING {ws_path}") - tries_before
            # 5 s, then 10 s (with jitter): at most a few tries in 12 s, not dozens
            assert tries <= 3, tries
            assert page.get_attribute("#conn", "data-state") == "reconnecting"
        # the slot is free: the page connects on its next try, by itself
        wait_until(
            lambda: (
                page.get_attribute("#conn", "data-state") == "live"
                and page.evaluate("window.__connStates.slice(-1)[0]") == "live"
            ),
            timeout=120,
            message="the page to connect once a slot is free",
        )
        time.sleep(1)
        assert page.get_attribute("#conn", "data-state") == "live"  # held, not closed again
    finally:
        web.kill()
