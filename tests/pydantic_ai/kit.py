"""Helpers of the Pydantic AI tests: a run of a test agent with a plan for its model, the test
MCP server as a real process and its ledger."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from agentruns.models import Run
from agentruns.services import start_run
from tests.procs import ROOT, Proc, base_env, free_port, wait_http
from tests.pydantic_ai.mcp_server import faults_path, read_ledger


def plan(*calls: tuple[str, dict], say: str = "Done.", **extra: object) -> str:
    """The message the test agents' FunctionModel plays (tests/pydantic_ai/agents.py)."""
    return json.dumps({"calls": [list(c) for c in calls], "say": say, **extra})


def planned(messages: list[ModelMessage]) -> dict:
    """The plan a test put in the run's first user message (`plan`), as a dict."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    return json.loads(str(part.content))
    return {}


def start(agent: str, *calls: tuple[str, dict], user=None, say: str = "Done.", **extra) -> Run:
    return start_run(agent, {"message": plan(*calls, say=say, **extra)}, user=user).run


def start_mcp(
    tmp_path: Path, port: int | None = None, *, sse: bool = False
) -> tuple[Proc, str, Path]:
    """The test MCP server (tests/pydantic_ai/mcp_server.py) over streamable HTTP (or SSE), a
    real process: (process, its /mcp (or /sse) URL, its ledger file)."""
    port = port or free_port()
    ledger = tmp_path / "mcp-ledger.json"
    proc = Proc(
        [sys.executable, "-m", "tests.pydantic_ai.mcp_server", "--ledger", str(ledger)]
        + ["--port", str(port)]
        + (["--sse"] if sse else []),
        base_env(),
        tmp_path / f"mcp-{port}.log",
    ).start()
    base = f"http://127.0.0.1:{port}"
    # the SSE endpoint is a stream that never ends: its message path answers at once
    wait_http(base + ("/messages/" if sse else "/mcp"), proc)
    return proc, base + ("/sse" if sse else "/mcp"), ledger


class SharedMcp:
    """The test MCP server over streamable HTTP for a whole module (a module-scoped fixture
    holds it): starting one is a Python process importing the `mcp` SDK, seconds on a busy box.
    `fresh()` hands it to one test with an empty ledger and no faults, started again (same
    port, same ledger) if an earlier test's fault made it exit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: Proc | None = None

    def fresh(self) -> tuple[Proc, str, Path]:
        if self.proc is not None and self.proc.alive:
            self.path.write_text("{}")
            faults_path(self.path).unlink(missing_ok=True)
        else:
            port = None
            if self.proc is not None:
                self.proc.kill()
                port = int(self.url.rsplit(":", 1)[1].split("/")[0])
            for stale in (
                self.directory / "mcp-ledger.json",
                faults_path(self.directory / "mcp-ledger.json"),
            ):
                stale.unlink(missing_ok=True)
            self.proc, self.url, self.path = start_mcp(self.directory, port)
        return self.proc, self.url, self.path

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def ledger(path: Path) -> dict:
    return read_ledger(path)


def stdio_transport(ledger_path: Path, *, keep_alive: bool | None = False) -> object:
    """The test MCP server over stdio: a real process started for each session (each call).
    `keep_alive=None`: FastMCP's default, as a user's `MCPToolset("server.py")` has it."""
    from fastmcp.client.transports import StdioTransport

    return StdioTransport(
        sys.executable,
        ["-m", "tests.pydantic_ai.mcp_server", "--ledger", str(ledger_path)],
        env=base_env(),
        cwd=str(ROOT),
        keep_alive=keep_alive,
    )
