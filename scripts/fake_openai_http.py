"""The wire side of the fake OpenAI server (scripts/fake_openai_server.py): what a scripted turn
or failure is, what a request was, and the HTTP handler that speaks Chat Completions (SSE)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any


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
    status: int | None = None  # the HTTP status it was answered with (None: not answered yet)

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
def _headers(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    """Request headers with lower-case names (HTTP header names are case-insensitive)."""
    return {name.lower(): value for name, value in handler.headers.items()}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming, like the real API
    server_state: Any  # the FakeOpenAI serving (fake_openai_server.py)
    recorded: RecordedRequest | None = None  # the request being answered on this connection

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the records
        pass

    # -------------------------------------------------------------- plumbing
    def _record(self, request: RecordedRequest) -> None:
        self.recorded = request
        self.server_state._record(request)

    def send_response(self, code: int, message: str | None = None) -> None:
        # every answer passes here: the record says which one its request took (with several
        # requests in flight, the order of arrival is not the order the script is taken in)
        if self.recorded is not None and self.recorded.status is None:
            self.recorded.status = code
        super().send_response(code, message)

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
        self._record(RecordedRequest("GET", self.path, _headers(self), None, time.monotonic()))
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
        elif self.path.rstrip("/").endswith("/_fake/limit"):  # what the rate limit counted
            self._json(200, fake.limit_counts())
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        fake = self.server_state
        chat = self.path.rstrip("/").endswith("/chat/completions")
        authorized = (
            fake.api_key is None or self.headers.get("Authorization") == f"Bearer {fake.api_key}"
        )
        # the provider's rate limit counts a request as it arrives, before its body is read
        refused = fake._admit() if chat and authorized else None
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"null")
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        self._record(RecordedRequest("POST", self.path, _headers(self), body, time.monotonic()))
        if not chat:
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
        if not authorized:
            self._error(
                Fail(401, "Incorrect API key provided. You can find your API key in your account.")
            )
            return
        if refused is not None:
            self._error(refused)
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
