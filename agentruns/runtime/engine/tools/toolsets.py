"""The toolsets around the run's tools: every call of the agent's loop reaches its step's unit
(`unit.py`) through `StepsToolset`; an MCP server's tools are those listed when its agent
registered (`RegisteredTools`), so nothing is asked of a server before a call."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    CallToolResult,
    durable_unit_scope,
)
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.function import FunctionToolsetTool

from agentruns.registry import (
    ServerUnavailable,
    UnknownTool,
    get_tool,
)
from agentruns.registry.pydantic_agents.calls import classified, registered_listing
from agentruns.runtime.engine.pydantic_ai_private import (
    in_durable_unit,
    unwrap_tool_call_result,
    wrap_tool_call_result,
)
from agentruns.runtime.engine.slice import current_or_none
from agentruns.runtime.engine.tools.unit import execute
from agentruns.runtime.outages.faults import is_infrastructure_error


class StepsToolset(WrapperToolset[Any]):
    """Around the run's toolset (our durability's `get_wrapper_toolset`): a tool call of the
    agent's loop is its step's unit, whatever toolset the tool is in. The call itself is the
    unit's body, its outcome recorded as Pydantic AI's `CallToolResult` (control flow as data)
    and given back to the loop as the toolset's answer."""

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        state = current_or_none()
        if state is None or in_durable_unit():
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        tool = _uncut(tool)

        async def body() -> Any:
            with durable_unit_scope():
                call = self.wrapped.call_tool(name, tool_args, ctx, tool)
                result = await wrap_tool_call_result(
                    classified(name, call, rerun_safe=_rerun_safe(name))
                )
                return JSON_CODEC.dump(CallToolResult, result)

        payload = await execute(state, "call", name, ctx, body)
        return unwrap_tool_call_result(JSON_CODEC.load(CallToolResult, payload))


def _uncut(tool: Any) -> Any:
    """A sync function tool runs to its end whatever its timeout: its thread cannot be stopped,
    so a timeout would tell the model "timed out" about an effect that happened. (A combined
    toolset's tool carries the function toolset's as `source_tool`, and hands its own
    `tool_def` down.)"""
    leaf = tool
    while (inner := getattr(leaf, "source_tool", None)) is not None:
        leaf = inner
    if isinstance(leaf, FunctionToolsetTool) and not leaf.is_async:
        if tool.tool_def.timeout != math.inf:
            return replace(tool, tool_def=replace(tool.tool_def, timeout=math.inf))
    return tool


@dataclass
class RegisteredTools(WrapperToolset[Any]):
    """An MCP server's tools as they were listed when its agent registered: a run's tools are
    those its snapshot names, so the loop asks no server for them (a server that is down is the
    call's weather, not the run's); each call connects on its own, inside its unit."""

    definitions: dict[str, ToolDefinition] = field(default_factory=dict)

    async def __aenter__(self) -> RegisteredTools:
        return self  # nothing to connect before a call

    async def __aexit__(self, *args: Any) -> None:
        return None

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        return {
            name: await self.wrapped.get_tool_for_tool_def(definition, ctx)
            for name, definition in self.definitions.items()
        }

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        """Connected for this call: a server that does not come up (or answer its handshake)
        got nothing of the call, which is weather (`ServerUnavailable`), not an attempt."""
        leaf = self.wrapped
        try:
            await leaf.__aenter__()
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            server = str(getattr(leaf, "id", None) or getattr(leaf, "label", "MCP server"))
            raise ServerUnavailable(
                f"{name}: {server} unreachable: {exc!r}", server=server
            ) from exc
        try:
            return await leaf.call_tool(name, tool_args, ctx, tool)
        finally:
            await leaf.__aexit__(None, None, None)


def registered_tools(leaf: Any) -> Any:
    """`visit_and_replace` visitor: an MCP server listed at registration, as listed then."""
    listing = registered_listing(leaf)
    return leaf if listing is None else RegisteredTools(leaf, listing)


def _rerun_safe(name: str) -> bool:
    """A broken connection may be retried: the tool is read-only or idempotent."""
    try:
        tool = get_tool(name)
    except UnknownTool:
        return False
    return not tool.side_effect or tool.idempotency == "key"
