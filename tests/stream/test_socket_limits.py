"""Long-lived connections against a real daphne: the socket caps (4013, "try later"), the exact origin check,
unknown socket paths (4404), and connections that end with their credential (stream/access/):
a revoked token ends an open chat SSE stream, signing out closes the session's sockets.

The tests share one daphne (each with users, tokens and runs of its own), but the one that reads
the server's log for tracebacks, which starts its own."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from agentruns.models import ApiToken, Run
from agentruns.tokens import create_token
from tests.helpers import make_user
from tests.procs import module_web, start_web, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

VIEWER = ["agentruns.view_run"]
RECHECK_BOUND = 6.0  # the recheck runs every 2 s; the rest is this loaded machine's slack
SOCKETS_PER_USER = 2


@pytest.fixture(scope="module")
def url(tmp_path_factory, django_db_setup, django_db_blocker):
    """The module's daphne (no worker: a run stays as the test made it)."""
    with module_web(
        tmp_path_factory, django_db_blocker, AGENTRUNS_SOCKETS_PER_USER=SOCKETS_PER_USER
    ) as base_url:
        yield base_url


def _closed(socket):
    """The close frame the server sent, once it has (None while the socket is open)."""
    try:
        socket.recv(timeout=0.5)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        return exc.rcvd
    return None


def _pong(socket) -> bool:
    socket.send(json.dumps({"type": "ping"}))
    return json.loads(socket.recv(timeout=10))["type"] == "pong"


def test_sockets_over_the_per_user_cap_close_with_try_later(url, django_user_model):
    viewer = make_user(django_user_model, "viewer", VIEWER)
    token = create_token(viewer)
    other = create_token(make_user(django_user_model, "other", VIEWER))
    run = Run.objects.create(agent="script", input={}, status="running")
    ws_url = url.replace("http", "ws") + f"/ws/runs/{run.id}/?after=0"

    def open_as(raw: str):
        return connect(ws_url, origin=url, additional_headers={"Authorization": f"Bearer {raw}"})

    with open_as(token) as first, open_as(token) as second:
        assert _pong(first) and _pong(second)
        with open_as(token) as third:
            closed = wait_until(lambda: _closed(third), timeout=10, message="the 3rd to close")
            assert closed.code == 4013
        with open_as(other) as theirs:  # the cap is per user
            assert _pong(theirs)
        first.close()
        time.sleep(0.5)
        with open_as(token) as again:  # a slot was given back
            assert _pong(again)


def test_the_origin_must_match_scheme_host_and_port(url, lead):
    run = Run.objects.create(agent="script", input={}, status="running")
    ws_url = url.replace("http", "ws") + f"/ws/runs/{run.id}/"
    auth = {"Authorization": f"Bearer {create_token(lead)}"}
    for foreign in ("http://127.0.0.1:9999", url.replace("http", "https"), "null"):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url, origin=foreign, additional_headers=auth)
        assert refused.value.response.status_code == 403, foreign
    with connect(ws_url, origin=url, additional_headers=auth) as own:
        assert _pong(own)


def test_an_unknown_socket_path_closes_4404_without_a_traceback(tmp_path, lead):
    web, url = start_web(tmp_path)  # its own: its whole log is this test's
    try:
        for path in ("/ws/nothing/", "/ws/runs/not-a-run/", "/"):
            with connect(url.replace("http", "ws") + path, origin=url) as socket:
                closed = wait_until(lambda s=socket: _closed(s), timeout=10, message=path)
                assert closed.code == 4404, path
    finally:
        web.kill()
    assert "Traceback" not in web.log() and "No route found" not in web.log()


def test_signing_out_closes_the_sessions_sockets(url, lead):
    browser = Client()
    browser.force_login(lead)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"
    run = Run.objects.create(agent="script", input={}, status="running")
    ws_url = url.replace("http", "ws") + f"/ws/runs/{run.id}/?after=0"
    with connect(ws_url, origin=url, additional_headers={"Cookie": cookie}) as socket:
        assert _pong(socket)
        browser.logout()  # Django's own logout: the session row is deleted
        signed_out = time.monotonic()
        closed = wait_until(lambda: _closed(socket), timeout=30, message="the socket to close")
        assert time.monotonic() - signed_out < RECHECK_BOUND
        assert closed.code == 4401


def test_revoking_a_token_ends_an_open_chat_stream(url, django_user_model):
    chatter = make_user(django_user_model, "chatter", ["agentruns.view_run", "agentruns.start_run"])
    token = create_token(chatter)
    # (the module's server has no worker: the run stays queued, the stream stays open)
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund please"}]}
    body = {"id": "T-1030", "messages": [message], "input": {"order_id": "ORD-1001"}}
    lines: list[str] = []
    ended = threading.Event()

    def read() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.stream(
            "POST", f"{url}/api/chat/refund", json=body, headers=headers, timeout=60
        ) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                lines.append(line)
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: any(line.startswith("data:") for line in lines), timeout=30)
    time.sleep(0.5)
    assert not ended.is_set()  # open: the run has not even started
    ApiToken.objects.update(revoked=True)
    revoked = time.monotonic()
    assert ended.wait(30), "the stream is still open after the token was revoked"
    assert time.monotonic() - revoked < RECHECK_BOUND
    data = [json.loads(line[5:]) for line in lines if line.startswith("data: {")]
    assert data[-1] == {"type": "error", "errorText": "token revoked or expired"}
