"""The Pydantic AI agent that `@tool` and `Agent` declarations build: one path for every agent.

A registry `Agent` of native tools becomes a `pydantic_ai.Agent` with its instructions and one
`FunctionToolset` (id: the agent's name) of its tools, each a Pydantic AI tool from the tool's own
JSON schema whose function calls the native one with the call's `ToolContext` (the step it runs
as, `current_step()`). The engine validates a call's arguments against that schema when it plans
the call (DESIGN.md 4.8: bad ones are failed steps fed back to the model), so the Pydantic AI
tool checks nothing of its own. The agent has no model of its own (each run names one) and
feeds bad output back for as long as the run's own limits allow, as the engine always did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import Tool as PydanticTool
from pydantic_ai.toolsets import FunctionToolset

from agentruns.registry.context import current_step

# how many times one tool (or the output) may be fed back to the model: the run's max_steps
# and budgets are what stop a model that keeps getting it wrong
RETRIES = 1_000_000


def _function(func: Callable[..., Any]) -> Callable[..., Any]:
    def call(**arguments: Any) -> Any:
        return func(current_step(), **arguments)

    return call


def build(agent: Any, tools: Sequence[Any]) -> PydanticAgent:
    """The Pydantic AI agent of a registry `Agent` whose tools are `tools` (registry Tools)."""
    toolset = FunctionToolset(
        [
            PydanticTool.from_schema(
                _function(tool.func),
                name=tool.name,
                description=tool.description,
                json_schema=tool.parameters,
                sequential=True,
            )
            for tool in tools
        ],
        id=agent.name,
    )
    return PydanticAgent(
        None,
        name=agent.name,
        instructions=agent.instructions or None,
        toolsets=[toolset],
        retries=RETRIES,
        defer_model_check=True,
    )
