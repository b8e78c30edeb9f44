"""The web while PostgreSQL is down (DESIGN.md 4.10): a real daphne (DEBUG=1, the worst case for
leaking a traceback) on a PostgreSQL server of the test's own, which the test stops and starts.

While it is down: every /api/ route answers 503 JSON `{"error"}` with Retry-After (GET and POST,
bearer token made before the outage), pages answer a plain 503 page (no traceback, no debug
page), /healthz answers 503 naming "database", a socket open before the outage and a new one both
close with 4503 ("try again later": RFC 6455's 1013 cannot leave daphne), and no request takes
longer than its timeout. Once the server is back, every one answers as before. The figures are
printed ([db-outage] lines).
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.pgserver import PrivatePostgres
from tests.procs import start_run_over_http, start_web, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

PASSWORD = "outage-drill-password-31"
WEB_POOL_WAIT = 1.5  # WEB_DB_POOL_TIMEOUT of the server under test (default 3: each request
# of the outage waits it out, and 18 of them at 3 s made most of a minute-long drill)
REQUEST_TIMEOUT = 8.0  # what a client of the drill waits for any answer


@pytest.fixture
def drill(tmp_path):
    pg = PrivatePostgres("web-outage")
    pg.start()
    pg.create_database()
    pg.migrate()
    token = pg.lead_token
    pg.set_password("lead", PASSWORD)
    web, url = start_web(tmp_path, DATABASE_URL=pg.url, DEBUG=1, WEB_DB_POOL_TIMEOUT=WEB_POOL_WAIT)
    try:
        yield pg, web, url, token
    finally:
        web.stop()
        pg.close()


def signed_in(url: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT)
    form = client.get("/accounts/login/").text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    answer = client.post(
        "/accounts/login/",
        data={"username": "lead", "password": PASSWORD, "csrfmiddlewaretoken": csrf},
    )
    assert answer.status_code == 302, answer.text[:500]
    return client


class Probe:
    """Every route of the drill, timed; what each answered."""

    def __init__(self, url: str, token: str, run_id: str, session: httpx.Client) -> None:
        self.url, self.token, self.run_id, self.session = url, token, run_id, session
        self.answers: list[tuple[str, int, float, httpx.Response | None]] = []

    def api(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return self._timed(
            f"{method} {path}",
            lambda: httpx.request(
                method,
                self.url + path,
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=REQUEST_TIMEOUT,
            ),
        )

    def page(self, path: str) -> httpx.Response:
        return self._timed(f"page {path}", lambda: self.session.get(path))

    def _timed(self, name: str, call) -> httpx.Response | None:
        started = time.monotonic()
        try:
            response = call()
        except httpx.TimeoutException:
            self.answers.append((name, -1, time.monotonic() - started, None))
            return None
        self.answers.append((name, response.status_code, time.monotonic() - started, response))
        return response

    def api_routes(self) -> list[httpx.Response]:
        run = self.run_id
        return [
            self.api("GET", f"/api/runs/{run}"),
            self.api("GET", f"/api/runs/{run}/events?after=0"),
            self.api("GET", "/api/approvals?status=pending"),
            self.api("POST", "/api/runs", {"agent": "refund", "input": {"order_id": "ORD-1003"}}),
            self.api("POST", f"/api/runs/{run}/retry", {}),
        ]

    def pages(self) -> list[httpx.Response]:
        return [self.page("/runs/"), self.page(f"/runs/{self.run_id}/"), self.page("/approvals/")]


def socket_close_code(ws_url: str, token: str, origin: str, *, wait: float) -> int | None:
    """Open a socket and read until it closes; its close code (None: still open after `wait`)."""
    with connect(
        ws_url,
        origin=origin,
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=REQUEST_TIMEOUT,
        close_timeout=1,
    ) as ws:
        ends = time.monotonic() + wait
        try:
            while time.monotonic() < ends:
                ws.recv(timeout=max(0.01, ends - time.monotonic()))
        except TimeoutError:
            return None
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
    return None


def test_database_outage_answers_503_everywhere_then_200_again(drill):
    pg, web, url, token = drill
    run_id = start_run_over_http(url, token, {"order_id": "ORD-1001", "message": "Broken."})
    session = signed_in(url)
    probe = Probe(url, token, run_id, session)
    ws_url = url.replace("http://", "ws://") + f"/ws/runs/{run_id}/?after=0"

    # up: the drill's routes answer normally
    assert [r.status_code for r in probe.pages()] == [200, 200, 200]
    open_socket = connect(  # noqa: SIM115 - it must stay open across the outage
        ws_url,
        origin=url,
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=REQUEST_TIMEOUT,
        legacy=True,
    )
    first = json.loads(open_socket.recv(timeout=REQUEST_TIMEOUT))
    assert first["seq"] == 1

    pg.stop()
    outage_started = time.monotonic()
    probe.answers.clear()

    # a socket open before the outage is closed with "try again later"
    try:
        while True:
            open_socket.recv(timeout=REQUEST_TIMEOUT + 5)
    except ConnectionClosed as closed:
        assert closed.rcvd is not None and closed.rcvd.code == 4503, closed
    finally:
        open_socket.close()

    for _ in range(2):  # at once (broken pooled connections), then with the pool empty
        for response in probe.api_routes():
            assert response is not None, "an API request ran past its timeout"
            assert response.status_code == 503, (response.request.url, response.text[:300])
            assert response.headers["content-type"].startswith("application/json")
            assert "database" in response.json()["error"]
            assert int(response.headers["Retry-After"]) > 0
        for response in probe.pages():
            assert response is not None, "a page ran past its timeout"
            assert response.status_code == 503, (response.request.url, response.text[:300])
            assert response.headers["content-type"].startswith("text/html")
            assert int(response.headers["Retry-After"]) > 0
            assert "Back soon" in response.text and "database" in response.text
            assert "Traceback" not in response.text and "DEBUG" not in response.text
        health = probe.api("GET", "/healthz")
        assert health is not None and health.status_code == 503
        assert "database" in health.json()["failed"]
        assert health.json()["checks"]["database"]["ok"] is False
        # a new socket: accepted and closed with 4503, never a failed handshake
        assert socket_close_code(ws_url, token, url, wait=REQUEST_TIMEOUT) == 4503

    statuses = [status for _, status, _, _ in probe.answers]
    slowest = max(seconds for _, _, seconds, _ in probe.answers)
    assert statuses.count(500) == 0
    assert all(seconds < REQUEST_TIMEOUT for _, _, seconds, _ in probe.answers)
    outage_seconds = time.monotonic() - outage_started
    print(
        f"\n[db-outage] {len(statuses)} requests during a {outage_seconds:.1f}s outage: "
        f"{statuses.count(503)} x 503, {statuses.count(500)} x 500, "
        f"{statuses.count(-1)} past the {REQUEST_TIMEOUT:g}s timeout, slowest {slowest:.2f}s "
        f"(web pool wait {WEB_POOL_WAIT:g}s)"
    )

    # back: everything answers as before, within seconds of the server's return
    pg.start()
    back_at = time.monotonic()
    wait_until(
        lambda: (r := probe.api("GET", f"/api/runs/{run_id}")) is not None and r.status_code == 200,
        timeout=30,
        interval=0.1,
        message="the API to answer 200 again",
    )
    recovered = time.monotonic() - back_at
    probe.answers.clear()
    got = [r.status_code for r in probe.api_routes()]
    assert got == [200, 200, 200, 201, 409], got  # retry: the run is queued, not failed
    assert [r.status_code for r in probe.pages()] == [200, 200, 200]
    health = probe.api("GET", "/healthz").json()
    assert health["checks"]["database"]["ok"] is True and "database" not in health["failed"]
    assert socket_close_code(ws_url, token, url, wait=1.0) is None  # stays open, streams
    print(f"[db-outage] the API answered 200 again {recovered:.2f}s after the server's return")
