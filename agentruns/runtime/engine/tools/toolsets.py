"""An MCP server's tools as its agent registered them (`RegisteredTools`): the run's toolset
lists those, so nothing is asked of a server before a call, and each call connects inside its
unit (the run's toolset around them is `durability.StepsToolset`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import WrapperToolset

from agentruns.registry import ServerUnavailable
from agentruns.registry.pydantic_agents.calls import registered_listing
from agentruns.runtime.outages.faults import is_infrastructure_error


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
