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
  no call, an unanswered tool call), as the real API does.

Responses come from a scripted queue (`FakeOpenAI.script(Reply(...), Fail(429, ...), ...)`);
when the queue is empty the server falls back to its mode: `refund` plays the demo's refund
agent from the conversation alone (support/policy.py, the same flow as the offline model),
`echo` repeats the last user message, `error` answers 400. Every request is recorded.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = ("refund", "echo", "error")


@dataclass
class Reply:
    """One assistant turn, streamed in fragments of `chunk_chars` with `delay` between chunks."""

    text: str = ""
    # (name, arguments): a dict is sent as JSON, a str exactly as given (it may be broken JSON)
    tool_calls: list[tuple[str, dict | str]] = field(default_factory=list)
    chunk_chars: int = 8
    delay: float = 0.0
    usage: tuple[int, int] | None = None  # (prompt, completion); None: estimated from the text
    drop_after: int | None = None  # close the connection after this many chunks, mid-stream
    call_ids: list[str] | None = None  # None: call_<conversation length>_<i> (deterministic)


@dataclass
class Fail:
    """An error response in OpenAI's JSON shape."""

    status: int
    message: str = ""
    retry_after: float | None = None
    code: str | None = None


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any
    received_at: float  # time.monotonic()

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", []) if isinstance(self.body, dict) else []


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def conversation_problem(body: Any) -> str | None:
    """What the real API would reject with a 400, or None for a well-formed request."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not body.get("model"):
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    open_calls: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}]: invalid role {role!r}"
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                return (
                    f"messages[{i}]: messages with role 'tool' must be a response to a preceding "
                    f"message with 'tool_calls' (unknown tool_call_id {call_id!r})"
                )
            open_calls.remove(call_id)
            continue
        if open_calls:
            return (
                "an assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'; missing: {', '.join(open_calls)}"
            )
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if message.get("content") is None and not calls:
                return f"messages[{i}]: an assistant message needs content or tool_calls"
            for call in calls:
                function = call.get("function") or {}
                if call.get("type") != "function" or not call.get("id") or not function.get("name"):
                    return f"messages[{i}]: malformed tool call {call!r}"
                if not isinstance(function.get("arguments"), str):
                    return f"messages[{i}]: tool call arguments must be a string"
                open_calls.append(call["id"])
        elif not isinstance(message.get("content"), str):
            return f"messages[{i}]: content must be a string"
    if open_calls:
        return f"tool calls without a tool response: {', '.join(open_calls)}"
    for tool in body.get("tools") or []:
        function = tool.get("function") or {} if isinstance(tool, dict) else {}
        if tool.get("type") != "function" or not function.get("name"):
            return f"malformed tool definition {tool!r}"
    return None


# ------------------------------------------------------------------------ fallback modes
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
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.delay, self.api_key = mode, delay, api_key
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


def _headers(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    """Request headers with lower-case names (HTTP header names are case-insensitive)."""
    return {name.lower(): value for name, value in handler.headers.items()}


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_state = fake

    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming, like the real API
    server_state: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the records
        pass

    # -------------------------------------------------------------- plumbing
    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, fail: Fail) -> None:
        etype, code = _ERROR_TYPES.get(fail.status, ("api_error", None))
        message = fail.message or {
            401: "Incorrect API key provided.",
            429: "Rate limit reached for requests. Please try again later.",
            500: "The server had an error while processing your request.",
        }.get(fail.status, f"error {fail.status}")
        headers = {}
        if fail.retry_after is not None:
            headers["Retry-After"] = f"{fail.retry_after:g}"
        self._json(
            fail.status,
            {
                "error": {
                    "message": message,
                    "type": etype,
                    "param": None,
                    "code": fail.code or code,
                }
            },
            headers,
        )

    def _chunk(self, payload: bytes) -> None:
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    # -------------------------------------------------------------- routes
    def do_GET(self) -> None:
        fake = self.server_state
        fake._record(RecordedRequest("GET", self.path, _headers(self), None, time.monotonic()))
        if self.path.rstrip("/").endswith("/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}
                    ],
                },
            )
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        fake = self.server_state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        fake._record(RecordedRequest("POST", self.path, _headers(self), body, time.monotonic()))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(
                404,
                {
                    "error": {
                        "message": f"unknown path {self.path}",
                        "type": "invalid_request_error",
                    }
                },
            )
            return
        if (
            fake.api_key is not None
            and self.headers.get("Authorization") != f"Bearer {fake.api_key}"
        ):
            self._error(
                Fail(401, "Incorrect API key provided. You can find your API key in your account.")
            )
            return
        problem = conversation_problem(body)
        if problem:
            self._error(Fail(400, problem))
            return
        response = fake._next(body)
        if isinstance(response, Fail):
            self._error(response)
            return
        try:
            if body.get("stream"):
                self._stream(body, response)
            else:
                self._complete(body, response)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a crashed worker): nothing to do

    # -------------------------------------------------------------- responses
    def _turn(self, body: dict, reply: Reply) -> tuple[list[dict], tuple[int, int]]:
        position = len(body.get("messages") or [])
        calls = []
        for i, (name, args) in enumerate(reply.tool_calls):
            call_id = reply.call_ids[i] if reply.call_ids else f"call_{position}_{i}"
            arguments = args if isinstance(args, str) else json.dumps(args)
            calls.append({"id": call_id, "name": name, "arguments": arguments})
        if reply.usage is not None:
            usage = reply.usage
        else:
            prompt = sum(
                estimate_tokens(str(m.get("content") or "")) for m in body.get("messages") or []
            )
            completion = estimate_tokens(reply.text) + sum(
                estimate_tokens(c["arguments"]) for c in calls
            )
            usage = (prompt, completion)
        return calls, usage

    def _complete(self, body: dict, reply: Reply) -> None:
        calls, (prompt, completion) = self._turn(body, reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        self._json(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
        )

    def _stream(self, body: dict, reply: Reply) -> None:
        fake = self.server_state
        calls, (prompt, completion) = self._turn(body, reply)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": "fp_fake",
        }

        def choice(delta: dict, finish: str | None = None) -> dict:
            return {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        size = max(1, reply.chunk_chars)
        chunks: list[dict] = [choice({"role": "assistant", "content": ""})]
        chunks += [
            choice({"content": reply.text[i : i + size]}) for i in range(0, len(reply.text), size)
        ]
        for index, call in enumerate(calls):
            # the first fragment names the call; the arguments follow in pieces
            chunks.append(
                choice(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            args = call["arguments"]
            chunks += [
                choice(
                    {
                        "tool_calls": [
                            {"index": index, "function": {"arguments": args[i : i + size]}}
                        ]
                    }
                )
                for i in range(0, len(args), size)
            ]
        chunks.append(choice({}, "tool_calls" if calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(
                {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
            )

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        for chunk in chunks:
            if reply.drop_after is not None and sent >= reply.drop_after:
                # an abrupt end: no terminating chunk, the client sees a broken stream
                fake.chunks_sent.append(sent)
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if reply.delay and sent:
                time.sleep(reply.delay)
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            sent += 1
        # recorded before the end of the body, so a client that has read it all sees the count
        fake.chunks_sent.append(sent)
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")  # the zero-length chunk ends the chunked body


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
    args = parser.parse_args(argv)
    fake = FakeOpenAI(
        args.host, args.port, mode=args.mode, delay=args.delay_ms / 1000, api_key=args.api_key
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
