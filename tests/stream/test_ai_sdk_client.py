"""The AI SDK chat endpoint with the real client: `node --test tests/node` against a live server.

One daphne and one qcluster on the test PostgreSQL serve every Node test file (run one after
the other); the files use the pinned `ai` package (tests/node/package-lock.json, `npm ci`):
its chunk schema and parser, `readUIMessageStream`, and its chat client (`AbstractChat`,
`DefaultChatTransport`, `addToolApprovalResponse`). The worker streams slowly enough for
readers to be cut mid-run, crashes once per model step of the `script-short` agent
(failpoint `model_streaming`), and asks for approval above 100.00. The Node side restarts the
web server through a small control endpoint served here.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentruns.tokens import create_token
from support.models import Order
from tests import binaries
from tests.conftest import make_user
from tests.procs import ROOT, free_port, start_web, start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(900)]

NODE_TESTS = ROOT / "tests" / "node"
THRESHOLD_CENTS = 10_000
SERVER_ENV = {
    "AGENTRUNS_AGENT_MODULES": "tests.testkit,tests.thread_agents",
    "SCRIPTED_MODEL_DELAY_MS": "8",
    "REFUND_APPROVAL_THRESHOLD_CENTS": str(THRESHOLD_CENTS),
    "AGENTRUNS_FAILPOINTS": "model_streaming:script-short=crash_once",
}


class WebServer:
    """The daphne process, restartable on the same port from the Node side."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.port = tmp_path, free_port()
        self.lock = threading.Lock()
        self.proc, self.url = start_web(tmp_path, port=self.port, **SERVER_ENV)
        self.restarts = 0

    def restart(self) -> None:
        with self.lock:
            self.proc.kill()
            self.proc, _ = start_web(self.tmp_path, port=self.port, **SERVER_ENV)
            self.restarts += 1


def control_server(web: WebServer) -> ThreadingHTTPServer:
    class Control(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/restart-web":
                self.send_error(404)
                return
            web.restart()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"restarted")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Control)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_ai_sdk_client_against_the_live_server(tmp_path, seeded, django_user_model):
    node = binaries.require("node", "the AI SDK client tests")
    if not (NODE_TESTS / "node_modules" / "ai").is_dir():
        binaries.require("npm", "tests/node's pinned packages")  # make test installs them with npm
        raise AssertionError("run `npm ci` in tests/node first (make node-deps)")
    # role (as the Node tests name it) -> (username, permissions); seed_demo has its own users
    users = {
        "chatter": (
            "chatter",
            [
                "agentruns.view_run",
                "agentruns.start_run",
                "approvals.view_approval",
                "approvals.decide_approval",
            ],
        ),
        "viewer": ("looker", ["agentruns.view_run", "approvals.view_approval"]),
        "inbox": (
            "inbox",
            ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
        ),
    }
    tokens = {
        role: create_token(make_user(django_user_model, username, perms))
        for role, (username, perms) in users.items()
    }
    orders = list(Order.objects.order_by("order_id"))
    big = [o for o in orders if o.amount_cents > THRESHOLD_CENTS]
    # asked for $30 or less of these: no approval (and an order of their own per test)
    small = [o for o in orders if 3_000 < o.amount_cents <= THRESHOLD_CENTS]
    assert len(big) >= 4 and len(small) >= 3

    web = WebServer(tmp_path)
    worker = start_worker(
        tmp_path,
        AGENTRUNS_FAILPOINT_DIR=str(tmp_path / "failpoints"),
        REFUND_GATEWAY_URL=web.url + "/gateway",
        **SERVER_ENV,
    )
    control = control_server(web)
    try:
        env = {
            **os.environ,
            "CHAT_BASE_URL": web.url,
            "CHAT_CONTROL_URL": f"http://127.0.0.1:{control.server_address[1]}",
            "CHAT_TOKENS": json.dumps(tokens),
            "CHAT_ORDERS": json.dumps(
                {
                    "small": [o.order_id for o in small],
                    "big": [{"id": o.order_id, "amount_cents": o.amount_cents} for o in big],
                }
            ),
        }
        result = subprocess.run(
            [node, "--test", "--test-concurrency=1", "--test-reporter=spec"],
            cwd=NODE_TESTS,
            env=env,
            capture_output=True,
            text=True,
            timeout=800,
        )
        print(result.stdout[-20000:])
        assert result.returncode == 0, (
            f"node tests failed:\n{result.stdout[-15000:]}\n{result.stderr[-5000:]}\n"
            f"web log:\n{web.proc.log()}\nworker log:\n{worker.log()}"
        )
        assert web.restarts >= 1
    finally:
        control.shutdown()
        worker.kill()
        web.proc.kill()
