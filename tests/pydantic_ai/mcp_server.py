"""The back office's MCP server of the tests: a real `mcp` SDK server (streamable HTTP or stdio)
whose own ledger (a JSON file, so a stdio server started per session shares it) counts every
effect, which is what the tests assert on.

    python -m tests.pydantic_ai.mcp_server --ledger PATH [--port N [--sse]]   (no port: stdio)

Tools and their annotations: `get_stock` read-only; `set_status` idempotent (the same call twice
leaves one status, but both calls are counted); `send_mail` neither (every call sends one mail).

Faults a test sets in `<ledger>.faults` (JSON, read on every request, so a test may change them
while the server runs): `{"http_status": [503, 2]}` answers the next two `tools/call` requests
over HTTP with that status (the call is not made); `{"http_status_after": [500, 1]}` makes the next
call and then answers it with that status instead of its result (a server that failed after the
effect); `{"exit_in": "send_mail"}` makes that tool
do its effect and then the server process exit before it answers (the connection drops
mid-call), once; `{"hold_in": {"send_mail": 30}}` makes it wait that long after the effect
before it answers (a call under way, for a test to kill the caller mid-call), once per tool;
`{"fail_start": [true, 2]}` makes the next two server processes exit as they start.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

LEDGER = Path(os.environ.get("MCP_LEDGER", "mcp-ledger.json"))


def read_ledger(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except FileNotFoundError:
        return {}


def faults_path(ledger: Path) -> Path:
    return ledger.with_name(ledger.name + ".faults")


def set_faults(ledger: Path, **faults: Any) -> None:
    """What the server at `ledger` does wrong from its next request on (module docstring)."""
    faults_path(ledger).write_text(json.dumps(faults))


def _update(path: Path, change: Callable[[dict], Any]) -> Any:
    path.touch()
    with path.open("r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        data = json.loads(handle.read() or "{}")
        result = change(data)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(data))
    return result


def _record(change: Callable[[dict], Any]) -> Any:
    return _update(LEDGER, change)


def _take_fault(name: str) -> Any:
    """The fault `name` if it is set, used up: a count is decremented, anything else cleared."""

    def take(faults: dict) -> Any:
        value = faults.get(name)
        if isinstance(value, list) and value[1] > 0:
            value[1] -= 1
            return value[0]
        faults.pop(name, None)
        return None if isinstance(value, list) else value

    return _update(faults_path(LEDGER), take)


def _after_effect(tool: str) -> None:
    """The faults that strike between a tool's effect and its answer."""
    if _take_fault("exit_in") == tool:
        sys.stdout.flush()
        os._exit(3)  # the client's connection drops

    def take_hold(faults: dict) -> float:
        return float((faults.get("hold_in") or {}).pop(tool, 0))

    if hold := _update(faults_path(LEDGER), take_hold):
        time.sleep(hold)  # a call still under way: time for a test to kill its caller


class HttpFaults:
    """ASGI middleware: answers a `tools/call` with the status the faults file names, before
    the call (`http_status`) or after it was made (`http_status_after`)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        call = b'"tools/call"' in body
        status = _take_fault("http_status") if call else None
        if status:
            await _answer(send, status)
            return
        after = _take_fault("http_status_after") if call else None
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        if after:

            async def swallow(message: dict) -> None:
                pass  # the call's own answer is lost: the server failed after its effect

            await self.app(scope, replay, swallow)
            await _answer(send, after)
            return
        await self.app(scope, replay, send)


async def _answer(send: Callable, status: int) -> None:
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"error": "injected"}'})


server = MCPServer("backoffice")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def get_stock(sku: str) -> dict:
    """How many of an item are in stock."""
    _record(lambda ledger: ledger.update(reads=ledger.get("reads", 0) + 1))
    return {"sku": sku, "stock": 7}


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True))
def set_status(ticket: str, status: str) -> dict:
    """Set a ticket's status (setting it again changes nothing)."""

    def change(ledger: dict) -> dict:
        ledger.setdefault("statuses", {})[ticket] = status
        ledger["status_calls"] = ledger.get("status_calls", 0) + 1
        return {"ticket": ticket, "status": status}

    done = _record(change)
    _after_effect("set_status")
    return done


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
def send_mail(to: str, text: str) -> dict:
    """Send a mail to a customer (every call sends one)."""

    def change(ledger: dict) -> dict:
        mails = ledger.setdefault("mails", [])
        mails.append({"to": to, "text": text})
        return {"sent": len(mails)}

    sent = _record(change)
    _after_effect("send_mail")
    return sent


def main() -> None:
    global LEDGER
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sse", action="store_true", help="the SSE transport (/sse, /messages/)")
    options = parser.parse_args()
    LEDGER = Path(options.ledger)
    if _take_fault("fail_start"):
        sys.exit(4)  # a server that does not come up (a stdio server started for a call)
    if options.port:
        import uvicorn

        if options.sse:
            app = HttpFaults(server.sse_app(host="127.0.0.1"))
        else:
            app = HttpFaults(server.streamable_http_app(host="127.0.0.1"))
        uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning")
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
