"""Waits a run makes: the toolset agents add (`Agent(..., toolsets=[wait_tools()])`: ask a
colleague, ask the customer, sleep until a time or for a while) and the functions tool code calls
(`wait_for_event`, `wait_for_message`, `sleep_until`, `sleep_for`).

Each wait parks the run (status `waiting`, `waiting_for` says for what) and is journaled: the
run resumes in any worker process, after any restart, with what the wait returned. A question
defers its call (`CallDeferred`) and is answered in the inbox
(agentruns/runtime/engine/tools/questions.py).
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
from agentruns.registry.waits.messages import NotAConversation, ask_customer, wait_for_message
from agentruns.registry.waits.questions import ask_human
from agentruns.registry.waits.timers import sleep_for, sleep_until

__all__ = [
    "EventTimedOut",
    "EventWaitFailed",
    "NotAConversation",
    "TokenHeld",
    "ask_customer",
    "ask_human",
    "shared_tool_names",
    "sleep_for",
    "sleep_until",
    "wait_for_event",
    "wait_for_message",
    "wait_tools",
]

TOOLSET_ID = "agentruns_waits"

# the model's tools in `wait_tools()`, in the order the model sees them (a tool added here is
# offered to every agent that adds the toolset)
TOOLS: list[Callable[..., Any]] = [
    ask_human,
    ask_customer,
    timers.wait_until,
    timers.wait_for,
]


def wait_tools() -> FunctionToolset[Any]:
    """A fresh toolset of the waiting tools (each agent gets its own: toolsets are bound)."""
    return FunctionToolset(list(TOOLS), id=TOOLSET_ID)


def shared_tool_names() -> frozenset[str]:
    """Tool names every agent may declare (tool names are otherwise one agent's own)."""
    return frozenset(tool.__name__ for tool in TOOLS)
