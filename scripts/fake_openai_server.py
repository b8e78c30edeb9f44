#!/usr/bin/env python
"""A fake OpenAI-compatible Chat Completions server: a real socket, the real wire format.

Used by the test suite (the official `openai` SDK talks to it) and for demos:

    python scripts/fake_openai_server.py --port 8100
    AGENTRUNS_MODEL=openai/fake OPENAI_BASE_URL=http://127.0.0.1:8100/v1 make run

What it speaks (POST /v1/chat/completions, GET /v1/models):
- streaming responses as Server-Sent Events over chunked HTTP/1.1: `data: {chunk}` lines with
  content deltas, tool-call deltas (index, id, function name, then argument fragments), a final
  chunk with `finish_reason`, a usage chunk when `stream_options.include_usage` is set, and
  `data: [DONE]`; plain JSON when `stream` is false;
- error responses in OpenAI's shape (`{"error": {"message", "type", "code"}}`): 429 with
  `Retry-After`, 500, 401, and 400 for a malformed conversation (a tool message that answers
  no call, an unanswered tool call), as the real API does;
- a provider's rate limit (`rpm=`, `--rpm`): at most `rpm` chat requests in any 60 seconds and
  at most `per_second` (default ceil(rpm / 60)) in any second, counted when they arrive, as
  providers enforce a minute's limit over shorter windows; a request beyond either is answered
  429 with `Retry-After` and counted in `limit.refused` (`GET /v1/_fake/limit` answers the
  counts, for a server run as its own process).

Responses come from a scripted queue (`FakeOpenAI.script(Reply(...), Fail(429, ...), ...)`);
when the queue is empty the server falls back to its mode: `refund` plays the demo's refund
agent from the conversation alone (support/policy/, the same flow as the offline model),
`echo` repeats the last user message, `error` answers 400. Every request is recorded, with the
status it was answered with.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

try:
    from scripts.fake_openai_http import Fail, RecordedRequest, Reply, _Handler
except (
    ModuleNotFoundError
):  # run as `python scripts/fake_openai_server.py`: this folder is the path
    from fake_openai_http import Fail, RecordedRequest, Reply, _Handler  # type: ignore[no-redef]

MODES = ("refund", "echo", "error")

__all__ = ["Fail", "FakeOpenAI", "RecordedRequest", "Reply"]


def _refund_turn(messages: list[dict], delay: float) -> Reply:
    """The demo's refund agent, decided from the conversation only (like a real model)."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from support.policy import refund_policy  # the same flow as the offline scripted model

    try:
        turn = refund_policy(messages)
    except Exception as exc:  # a conversation the policy does not understand: answer plainly
        return Reply(text=f"I could not work out what to do next ({exc}).", delay=delay)
    return Reply(text=turn.text, tool_calls=list(turn.tool_calls), delay=delay, chunk_chars=12)


def _echo_turn(messages: list[dict], delay: float) -> Reply:
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    return Reply(text=f"Received: {last_user.get('content', '')}", delay=delay)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stopping must not wait for idle keep-alive connections

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up (a killed worker, a closed keep-alive pool) is normal here
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class ProviderLimit:
    """Requests a minute, enforced over sliding windows of a minute and of a second at arrival.
    A refused request does not count against the windows (it did no work)."""

    def __init__(self, rpm: int, per_second: int | None = None) -> None:
        self.rpm = rpm
        self.per_second = per_second or math.ceil(rpm / 60)
        self._arrivals: deque[float] = deque()  # admitted requests in the last minute
        self._lock = threading.Lock()
        self.admitted = 0
        self.refused = 0  # answered 429
        # (time.time(), admitted) of the latest requests, for a harness to see the pace it kept
        self.history: deque[tuple[float, bool]] = deque(maxlen=100_000)

    def admit(self) -> float | None:
        """A request arrives: None when it may go on, else the seconds until it would have been
        admitted."""
        with self._lock:
            now = time.monotonic()
            arrivals = self._arrivals
            while arrivals and now - arrivals[0] >= 60:
                arrivals.popleft()
            if len(arrivals) >= self.rpm:
                wait: float | None = 60 - (now - arrivals[0])
            elif len(arrivals) >= self.per_second and now - arrivals[-self.per_second] < 1:
                wait = 1 - (now - arrivals[-self.per_second])
            else:
                wait = None
                arrivals.append(now)
                self.admitted += 1
            if wait is not None:
                self.refused += 1
            self.history.append((time.time(), wait is None))
            return wait


class FakeOpenAI:
    """The server, run on a background thread: `with FakeOpenAI() as fake: fake.url ...`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        mode: str = "error",
        delay: float = 0.0,
        api_key: str | None = None,
        rpm: int | None = None,
        per_second: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.delay, self.api_key = mode, delay, api_key
        self.limit = ProviderLimit(rpm, per_second) if rpm else None
        self._queue: list[Reply | Fail] = []
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.chunks_sent: list[int] = []  # SSE data chunks per streamed response
        self._server = _QuietServer((host, port), _handler_for(self))
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- lifecycle
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The base URL for the SDK / OPENAI_BASE_URL."""
        return f"http://{self._server.server_address[0]}:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------- scripting
    def script(self, *responses: Reply | Fail) -> None:
        with self._lock:
            self._queue.extend(responses)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.chunks_sent.clear()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def limit_counts(self) -> dict:
        limit = self.limit
        if limit is None:
            return {"rpm": None}
        return {
            "rpm": limit.rpm,
            "per_second": limit.per_second,
            "admitted": limit.admitted,
            "refused": limit.refused,
            "history": list(limit.history),
        }

    def _admit(self) -> Fail | None:
        """The provider's rate limit (`rpm`): a 429 for a request beyond it."""
        wait = self.limit.admit() if self.limit is not None else None
        if wait is None:
            return None
        return Fail(
            429,
            f"Rate limit reached for requests: limit {self.limit.rpm} per minute, "
            f"{self.limit.per_second} per second.",
            retry_after=math.ceil(wait * 1000) / 1000,
        )

    def _next(self, body: dict) -> Reply | Fail:
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
        messages = body.get("messages") or []
        if self.mode == "refund":
            return _refund_turn(messages, self.delay)
        if self.mode == "echo":
            return _echo_turn(messages, self.delay)
        return Fail(400, "fake server: no scripted response left")


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_state = fake

    return Handler


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # handled like Ctrl-C


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="refund",
        help="how to answer: refund (plays the demo refund agent), echo, error",
    )
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=40,
        help="pause between streamed chunks, so the stream is visible in the UI",
    )
    parser.add_argument(
        "--api-key", default=None, help="require this bearer key (default: accept any)"
    )
    parser.add_argument(
        "--rpm", type=int, default=None, help="a rate limit: chat requests a minute (429 beyond)"
    )
    parser.add_argument(
        "--per-second", type=int, default=None, help="... and a second (default ceil(rpm / 60))"
    )
    args = parser.parse_args(argv)
    fake = FakeOpenAI(
        args.host,
        args.port,
        mode=args.mode,
        delay=args.delay_ms / 1000,
        api_key=args.api_key,
        rpm=args.rpm,
        per_second=args.per_second,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # a process manager stops us with SIGTERM
    fake.start()
    print(
        f"fake OpenAI-compatible server on {fake.url} (mode {args.mode}); Ctrl-C stops it",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
