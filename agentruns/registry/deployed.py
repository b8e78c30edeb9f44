"""Can the code deployed now still run a planned call? (a deploy may have removed its agent or
tool, or changed the tool's schema since the call was planned or parked)."""

from __future__ import annotations

from typing import Any

from agentruns.registry import (
    Tool,
    ToolArgumentsError,
    UnknownAgent,
    UnknownTool,
    get_agent,
    get_tool,
)


def cannot_run(agent: str, tool: str, args: Any) -> str:
    """Why the deployed code could not execute this parked call ("" when it can)."""
    return deployed_tool(agent, tool, args)[1]


def deployed_tool(agent: str, tool: str, args: Any) -> tuple[Tool | None, str]:
    """The deployed tool of a parked call, looked up once (a decision asks it everything), and
    why the code deployed now could not execute this parked call ("" when it can): a deploy
    removed its agent or renamed/removed its tool, or changed the tool's schema so the arguments
    no longer validate. Approving such a call is refused (fail closed); rejecting still works."""
    try:
        get_agent(agent)
    except UnknownAgent:
        return None, f"the agent {agent} is not deployed any more: approving is refused (reject it)"
    try:
        found = get_tool(tool)
    except UnknownTool:
        return None, (
            f"the tool {tool} is not deployed any more (renamed or removed): this call cannot "
            "run, approving is refused (reject it)"
        )
    try:
        found.validate(args)
    except ToolArgumentsError as exc:
        return found, (
            f"the arguments no longer fit the deployed schema of {tool} ({exc}): this call "
            "cannot run, approving is refused (reject it)"
        )
    except Exception as exc:  # a schema the validator cannot even read: fail closed, say so
        return found, (
            f"the deployed schema of {tool} cannot check these arguments "
            f"({type(exc).__name__}): this call cannot run, approving is refused (reject it)"
        )
    return found, ""


def approvals_required(tool: str, args: dict) -> int:
    """How many people must approve `tool` called with `args` (the tool's `approvals_required`;
    1 for a tool no longer registered)."""
    try:
        return get_tool(tool).approvals_for(args)
    except UnknownTool:
        return 1
