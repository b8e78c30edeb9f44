"""A Pydantic AI agent's toolsets as the engine sees them: what each tool call raises, in the
engine's vocabulary (`classified`), and the tools listed when the agent registered.

A call runs on the agent's own loop, inside its step's unit (runtime/engine/tools/). What it
raises is translated here: an MCP server that could not take the call (refused the connection,
did not start, answered 429 or 503) is `ServerUnavailable`: weather the step waits out without
using an attempt (nothing of the call reached it). An answer that may come after the server ran
the call (a 500, a 502/504 from its gateway, a connection that broke after the call was sent) is
retried under the tool's policy only for a read-only or idempotent tool: for any other the
outcome is unknown and reconciled by a person (`OutcomeUnknown`), never guessed. The MCP client
reports every HTTP error status as the same JSON-RPC error, so a response hook on the HTTP
transport notes the status of each `tools/call` answer for the call that made it
(`observe_http`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_ai import ApprovalRequired, CallDeferred, ModelRetry, RunContext
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import RunUsage

from agentruns.registry.errors import (
    FatalToolError,
    OutcomeUnknown,
    RetryableToolError,
    ServerUnavailable,
)
from agentruns.registry.pydantic_agents.mcp_errors import (
    CONNECTION_CLOSED,
    HTTP_ERROR_ANSWER,
    REQUEST_TIMED_OUT,
    broken_connection,
    error_answer,
    http_answers,
    is_ours,
    mcp_error,
    observe_http,
    transport_failure,
    unreachable,
)

T = TypeVar("T")


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, made current and reused, so every tool call of the thread sees
    the same loop (and an async client bound to a loop is kept per loop: on the process's run
    loop, runtime/engine/lanes.py, this is that loop)."""
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    return loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` (a registration's listing) to its end on an event loop of its own, closed
    after: an MCP session it opens ends with it, and the server's client connects again on the
    loop of the run that calls a tool (the process's run loop). A thread whose loop is already
    running (a registration from a notebook, or under Playwright's sync API) cannot run another
    on it: the call runs in a short-lived thread instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentruns-call") as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass
class ToolsetBinding:
    """One of the agent's toolsets, as registration lists it (and an MCP server's name)."""

    toolset: AbstractToolset
    agent: Any  # the pydantic_ai.Agent
    mcp: bool = False
    definitions: dict[str, ToolDefinition] = field(default_factory=dict)
    server: str = ""  # an MCP toolset's server, as the run's events name it

    def __post_init__(self) -> None:
        if self.mcp:
            self.server = observe_http(self.toolset)
            end_stdio_sessions_with_their_call(self.toolset)

    def listing_context(self) -> RunContext:
        """The run context a listing gets: no run yet (registration)."""
        model = self.agent.model
        return RunContext(
            deps=None,
            # a toolset rarely reads the model; an agent without one of its own gets a stand-in
            model=model if model is not None and not isinstance(model, str) else TestModel(),
            usage=RunUsage(),
            agent=self.agent,
        )

    def discover(self) -> dict[str, ToolDefinition]:
        """List the toolset's tools (an MCP server: over its transport)."""

        async def listing() -> dict[str, ToolDefinition]:
            ctx = self.listing_context()
            async with self.toolset:
                tools = await self.toolset.get_tools(ctx)
                for leaf in _mcp_leaves(self.toolset):  # (the same session: listed once more)
                    listed = await leaf.get_tools(ctx)
                    _leaf_listings[id(leaf)] = (leaf, {n: t.tool_def for n, t in listed.items()})
            return {name: tool.tool_def for name, tool in tools.items()}

        self.definitions = run_sync(listing())
        return self.definitions


# an MCP server's tools as they were listed when its agent registered (by the leaf toolset)
_leaf_listings: dict[int, tuple[AbstractToolset, dict[str, ToolDefinition]]] = {}


def _mcp_leaves(toolset: AbstractToolset) -> list[AbstractToolset]:
    leaves: list[AbstractToolset] = []
    toolset.apply(leaves.append)
    return [leaf for leaf in leaves if type(leaf).__name__ == "MCPToolset"]


def end_stdio_sessions_with_their_call(toolset: AbstractToolset) -> None:
    """A stdio MCP server's session ends with the call that opened it, as an HTTP server's does
    (each call connects on its own: runtime/engine/tools/toolsets.py, `RegisteredTools`).
    FastMCP keeps a stdio transport's session alive after its client exits unless told not to
    (`keep_alive`, on by default: `MCPToolset("server.py")`, the README's example): its server
    process and the session's tasks would stay on the process's run loop after the run, in the
    context of the call that opened them (that run's slice, its step's unit), for as long as
    the process lives, and every later call of any run would share that one session."""
    for leaf in _mcp_leaves(toolset):
        transport = getattr(getattr(leaf, "client", None), "transport", None)
        # (an MCP config of one server hands its calls to that server's transport)
        for each in (transport, getattr(transport, "transport", None)):
            if getattr(each, "keep_alive", None) is True:
                each.keep_alive = False


def registered_listing(leaf: AbstractToolset) -> dict[str, ToolDefinition] | None:
    """The tools of an MCP server (its leaf toolset) as listed at registration, or None."""
    found = _leaf_listings.get(id(leaf))
    return found[1] if found is not None and found[0] is leaf else None


def _connection_broke(name: str, exc: BaseException, *, safe: bool) -> None:
    """The call's connection broke: tried again when that is `safe` (read-only or idempotent, or
    nothing was sent yet), else an unknown outcome for a person to reconcile."""
    if safe:
        raise RetryableToolError(f"{name}: the connection broke: {exc!r}") from exc
    raise OutcomeUnknown(
        f"{name}: the connection broke mid-call ({exc!r}): the call may or may not have "
        "taken effect"
    ) from exc


# the toolset of each Pydantic AI tool registered (by its name): whether it is an MCP server's
_sites: dict[str, ToolsetBinding] = {}


def remember(name: str, binding: ToolsetBinding) -> None:
    _sites[name] = binding


async def classified(name: str, call: Coroutine[Any, Any, T], *, rerun_safe: bool) -> T:
    """`call` (a registered Pydantic AI tool's `call_tool`, inside its step's unit), with what
    it raises in the engine's vocabulary, as this module's docstring says: a server that could not take the
    call is `ServerUnavailable`, an answer that may come after the server ran it is retried for
    a read-only or idempotent tool and `OutcomeUnknown` for any other; Pydantic AI's own control
    flow (`ModelRetry`, `ToolFailed`, deferrals, bad arguments) and this app's database errors
    pass as they are."""
    binding = _sites.get(name)
    if binding is None:
        return await call
    answers: list[tuple[int, float | None]] = []
    token = http_answers.set(answers)
    try:
        return await call
    except (ModelRetry, ToolFailed) as exc:
        broke = mcp_error(exc)
        if broke is not None and (broke.code, broke.message) == HTTP_ERROR_ANSWER:
            error_answer(binding, name, exc, answers, rerun_safe=rerun_safe)
        if broke is not None and broke.code in (CONNECTION_CLOSED, REQUEST_TIMED_OUT):
            _connection_broke(name, exc, safe=rerun_safe)
        raise
    except (ValidationError, ApprovalRequired, CallDeferred, RetryableToolError, FatalToolError):
        raise
    except OutcomeUnknown:
        raise
    except Exception as exc:
        if is_ours(exc):
            raise  # this app's database or Redis: the engine's weather, never the tool's verdict
        if binding.mcp and unreachable(exc):
            raise ServerUnavailable(
                f"{name}: {binding.server} unreachable: {exc!r}", server=binding.server
            ) from exc
        if unreachable(exc) or (rerun_safe and transport_failure(exc)):
            raise RetryableToolError(f"{name}: server unreachable: {exc!r}") from exc
        if broken_connection(exc):
            _connection_broke(name, exc, safe=False)
        raise
    finally:
        http_answers.reset(token)
