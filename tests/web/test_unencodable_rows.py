"""A stored row with text UTF-8 cannot encode breaks nothing.

The API refuses lone surrogates now, but SQLite keeps them in JSON (older rows, or rows written
by any other path), and once one was in a run's input, /approvals/ and that run's page answered
500 for everyone and its socket stream stalled. Here such a run is written straight to a real
SQLite database (the embedded default), executed by a real worker until it parks for approval,
and every page, the API and the socket are read through a real daphne: all answer, showing the
character as U+FFFD, and the stream carries on to the end after the approval.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from websockets.sync.client import connect

from tests.procs import (
    base_env,
    free_port,
    manage,
    sqlite_env,
    start_web,
    start_worker,
    wait_until,
)
from tests.sqlite_templates import migrated_sqlite

WRITE_RUN = """
from agentruns.services import start_run
from django.contrib.auth import get_user_model
run = start_run(
    "refund",
    {"order_id": "ORD-1004", "message": "broken \\ud800 lamp \\udfff please refund"},
    user=get_user_model().objects.get(username="lead"),
).run
print(run.id)
"""


def test_a_lone_surrogate_in_a_stored_run_breaks_no_page_and_no_stream(tmp_path: Path, procs):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    overrides = {**sqlite_env(tmp_path / "db.sqlite3", base_url)}
    overrides["REFUND_APPROVAL_THRESHOLD_CENTS"] = 0  # it parks: an inbox card for everyone
    env = base_env(**overrides)
    *seeded, token = migrated_sqlite(tmp_path / "db.sqlite3", seeded=True)
    run_id = manage(env, "shell", "-c", WRITE_RUN).strip().splitlines()[-1]
    password = re.search(r"user lead\s+password (\S+)", "\n".join(seeded)).group(1)

    web, url = start_web(tmp_path, port=port, **overrides)
    procs.append(web)
    procs.append(start_worker(tmp_path, name="sqlite-worker", **overrides))
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def parked():
        return api.get(f"/api/runs/{run_id}").json()["status"] == "waiting"

    try:
        wait_until(parked, timeout=90, message="the run to park for approval")
    except TimeoutError:
        raise AssertionError(api.get(f"/api/runs/{run_id}").text) from None
    run = api.get(f"/api/runs/{run_id}").json()
    assert "\ufffd" in run["input"]["message"]  # shown replaced, not a 500
    approvals = api.get("/api/approvals").json()["approvals"]
    assert len(approvals) == 1

    browser = httpx.Client(base_url=url, timeout=30, follow_redirects=True)
    login = browser.get("/accounts/login/")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    signed_in = browser.post(
        "/accounts/login/",
        data={"username": "lead", "password": password, "csrfmiddlewaretoken": csrf},
    )
    assert signed_in.status_code == 200 and "Sign out" in signed_in.text
    for page in (
        "/approvals/",
        f"/runs/{run_id}/",
        "/runs/",
        f"/admin/agentruns/run/{run_id}/change/",
    ):
        response = browser.get(page)
        assert response.status_code == 200, (page, web.log())
        assert "broken \ufffd lamp" in response.text or page == "/runs/", page

    # the socket replays everything (the frames with the input included), then follows the run
    # to its end after the approval
    ws_url = url.replace("http", "ws") + f"/ws/runs/{run_id}/?after=0"
    with connect(ws_url, origin=url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        seen = [json.loads(ws.recv(timeout=20))]
        decided = api.post(f"/api/approvals/{approvals[0]['id']}", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        while not (seen[-1]["type"] == "run.status" and seen[-1]["data"]["status"] == "succeeded"):
            seen.append(json.loads(ws.recv(timeout=60)))
    assert [f["seq"] for f in seen] == list(range(1, len(seen) + 1))
    assert "Internal Server Error" not in web.log()
