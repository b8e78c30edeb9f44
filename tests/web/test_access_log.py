"""The web server as the Procfile runs it (`python -m config.serve`, daphne underneath): its
access log never holds a credential sent in a URL, and a request that stalls half-sent is
dropped after the idle timeout."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentruns.tokens import create_token
from tests.binaries import require
from tests.procs import Proc, base_env, free_port, start_web, wait_http

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_access_log_masks_tokens_in_query_strings(tmp_path, lead):
    token = create_token(lead)
    web, url = start_web(tmp_path)
    try:
        refused = httpx.get(f"{url}/api/runs?access_token={token}&after=3")
        assert refused.status_code in (401, 404, 405)
        httpx.get(f"{url}/runs/?token=hunter2-not-a-pattern&q=blender")
        httpx.get(f"{url}/x/{token}/")
        time.sleep(0.5)
    finally:
        web.kill()
    log = web.log()
    assert "access_token=••••••&after=3" in log  # the request is logged, its token is not
    assert "token=••••••&q=blender" in log
    assert token not in log and token[4:] not in log
    assert "hunter2" not in log


def test_a_half_sent_request_is_dropped_after_the_idle_timeout(tmp_path):
    port = free_port()
    args = [sys.executable, "-m", "config.serve", "--idle-timeout", "1", "-b", "127.0.0.1"]
    args += ["-p", str(port), "config.asgi:application"]
    web = Proc(args, base_env(), tmp_path / "web.log").start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", web)
        with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            sent = time.monotonic()
            assert conn.recv(1024) == b""  # closed by the server
            assert time.monotonic() - sent < 10
    finally:
        web.kill()


def test_daphne_listens_with_a_backlog_a_burst_of_connections_fits_in(tmp_path):
    """Twisted's default listen backlog is 50: a burst of chats had connections reset before
    daphne accepted them (where the app answers 429). `ss` shows a listening socket's backlog
    as its Send-Q."""
    ss = require("ss")
    port = free_port()
    args = [sys.executable, "-m", "config.serve", "-b", "127.0.0.1", "-p", str(port)]
    web = Proc([*args, "config.asgi:application"], base_env(), tmp_path / "web.log").start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", web)
        shown = subprocess.run(
            [ss, "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert int(shown[2]) == min(1024, somaxconn), shown
    finally:
        web.kill()
