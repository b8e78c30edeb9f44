"""Waits a run makes: the toolset agents add (`Agent(..., toolsets=[wait_tools()])`) and the
functions tool code calls (`wait_for_event`, `sleep_until`, `sleep_for`).

Each wait parks the run (status `waiting`, `waiting_for` says for what) and is journaled: the
run resumes in any worker process, after any restart, with what the wait returned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai.toolsets import FunctionToolset

from agentruns.registry.waits import timers
from agentruns.registry.waits.events import (
    EventTimedOut,
    EventWaitFailed,
    TokenHeld,
    wait_for_event,
)
from agentruns.registry.waits.timers import sleep_for, sleep_until

__all__ = [
    "EventTimedOut",
    "EventWaitFailed",
    "TokenHeld",
    "shared_tool_names",
    "sleep_for",
    "sleep_until",
    "wait_for_event",
    "wait_tools",
]

TOOLSET_ID = "agentruns_waits"

# the model's tools in `wait_tools()` (a tool added here is offered to every agent that adds it)
TOOLS: list[Callable[..., Any]] = [
    timers.wait_until,
    timers.wait_for,
]


def wait_tools() -> FunctionToolset:
    """The model's waits as a Pydantic AI toolset: `wait_until(when)`, `wait_for(seconds)`."""
    return FunctionToolset(list(TOOLS), id=TOOLSET_ID)


def shared_tool_names() -> frozenset[str]:
    """Tool names every agent may declare (tool names are otherwise one agent's own)."""
    return frozenset(tool.__name__ for tool in TOOLS)
