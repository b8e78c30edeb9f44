"""Tools that let an agent wait for people and systems, offered as one Pydantic AI toolset:

    register_agent(Agent("...", name="refund", toolsets=[wait_tools()]))

Each tool defers its call (`CallDeferred`); the engine parks the run on a `Wait` and resumes it
with the answer as the call's result (agentruns/runtime/engine/tools/questions.py for questions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai.toolsets import FunctionToolset

from agentruns.registry.waits.questions import ask_human

# the tool functions `wait_tools()` offers, in the order the model sees them
WAIT_TOOLS: list[Callable[..., Any]] = [ask_human]


def wait_tools() -> FunctionToolset[Any]:
    """A fresh toolset of the waiting tools (each agent gets its own: toolsets are bound)."""
    return FunctionToolset(list(WAIT_TOOLS), id="agentruns_waits")


__all__ = ["WAIT_TOOLS", "ask_human", "wait_tools"]
