"""A real HTTP receiver of webhooks for tests: a threaded `http.server` on a loopback port.

It answers by a plan: 500 to everything until `arm()` (`fail_until_armed`), 500 to the first
`fail_first` requests, then one request hangs past the sender's timeout (`hang_once`), then 200
to every request. It records every whole request it saw (headers, body, what it answered); a
request whose body a dying sender cut off is only counted (`truncated`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook


@dataclass
class Received:
    headers: dict[str, str]
    body: str
    answer: str  # "500", "hang", "200"

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Receiver:
    def __init__(
        self,
        *,
        fail_first: int = 0,
        fail_until_armed: bool = False,
        hang_once: bool = False,
        hang_seconds: float = 6,
    ) -> None:
        self.hang_seconds = hang_seconds
        self.fail_until_armed = fail_until_armed
        self.requests: list[Received] = []
        self.truncated = 0  # requests cut off by a dying sender (not recorded)
        self.lock = threading.Lock()
        self.armed = threading.Event()
        self.hanging = threading.Event()  # set when the one hanging request started
        self._hang_pending = hang_once
        self._failures_left = fail_first
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def start(self) -> Receiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def arm(self) -> None:
        """`fail_until_armed`: from now on the plan goes on (the hang, then 200s)."""
        self.armed.set()

    def _next_answer(self) -> str:
        with self.lock:
            if self.fail_until_armed and not self.armed.is_set():
                return "500"
            if self._failures_left > 0:
                self._failures_left -= 1
                return "500"
            if self._hang_pending:
                self._hang_pending = False
                return "hang"
            return "200"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if len(raw) < length:
                    # the sender died mid-request (a SIGKILLed worker): nothing was received, as a
                    # real receiver's framework would see it; the sender's retry sends it whole
                    with receiver.lock:
                        receiver.truncated += 1
                    return
                body = raw.decode()
                answer = receiver._next_answer()
                with receiver.lock:
                    receiver.requests.append(
                        Received({k.lower(): v for k, v in self.headers.items()}, body, answer)
                    )
                if answer == "hang":
                    receiver.hanging.set()
                    time.sleep(receiver.hang_seconds)
                code = 500 if answer == "500" else 200
                try:
                    self.send_response(code)
                    self.send_header("content-type", "text/plain")
                    self.end_headers()
                    self.wfile.write(b"ok" if code == 200 else b"receiver is down")
                except OSError:
                    pass  # the sender gave up (timeout) or died

        return Handler

    # ---------------------------------------------------------------- reading what came
    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def accepted_ids(self) -> set[str]:
        return {r.webhook_id for r in self.snapshot() if r.answer == "200"}

    def verified(self, secret: str) -> list[dict]:
        """Every request checked with the standardwebhooks library (raises if one fails)."""
        hook = Webhook(secret)
        return [hook.verify(r.body, r.headers) for r in self.snapshot()]
