"""The back office's MCP server of the tests: a real `mcp` SDK server (streamable HTTP or stdio)
whose own ledger (a JSON file, so a stdio server started per session shares it) counts every
effect, which is what the tests assert on.

    python -m tests.pydantic_ai.mcp_server --ledger PATH [--port N]   (no port: stdio)

Tools and their annotations: `get_stock` read-only; `set_status` idempotent (the same call twice
leaves one status, but both calls are counted); `send_mail` neither (every call sends one mail).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
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


def _record(change: Callable[[dict], Any]) -> Any:
    LEDGER.touch()
    with LEDGER.open("r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        ledger = json.loads(handle.read() or "{}")
        result = change(ledger)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(ledger))
    return result


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

    return _record(change)


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
def send_mail(to: str, text: str) -> dict:
    """Send a mail to a customer (every call sends one)."""

    def change(ledger: dict) -> dict:
        mails = ledger.setdefault("mails", [])
        mails.append({"to": to, "text": text})
        return {"sent": len(mails)}

    return _record(change)


def main() -> None:
    global LEDGER
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    LEDGER = Path(options.ledger)
    if options.port:
        server.run(transport="streamable-http", host="127.0.0.1", port=options.port)
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
