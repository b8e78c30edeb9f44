"""A `pydantic_ai.Agent` as an agent of this engine (`register_agent(agent)`).

A run executes the agent's own loop (`agent.run()`) inside the engine's durability capability
(`runtime/engine/`, docs/engine-design.md). Registration reads the agent once for what the
engine keeps outside the loop: its name, static instructions, model and settings (for the runs
list and the cost), and every tool of its toolsets with the engine's semantics (side effect,
idempotency, approvals, edits: `registry/durable.py`), which the registry turns into its `Tool`s
and the run's permission snapshot. What no run could carry durably is refused here, with the
reason (`checks.py`).

This package imports nothing of `agentruns.registry` but its errors: the registry builds its own
`Tool`s and `Agent` from the specs `adopt` returns.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    DynamicToolset,
    FunctionToolset,
    PreparedToolset,
    WrapperToolset,
)

from agentruns.registry.durable import (
    annotation_defaults,
    check_declaration,
    declaration_of,
    durable,
)
from agentruns.registry.pydantic_agents.calls import ToolsetBinding, remember, run_sync
from agentruns.registry.pydantic_agents.checks import NotDurable, check_durable

__all__ = ["Adopted", "NotDurable", "ToolSpec", "adopt", "durable", "is_pydantic_agent"]

# a server that is down is retried with backoff for longer than a function tool by default
MCP_RETRY = {"max_attempts": 5, "backoff_seconds": 1.0, "backoff_max_seconds": 10.0}
INPUT_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string"}},
    "required": ["message"],
}


@dataclass
class ToolSpec:
    """One tool of the agent, as the registry's `tool()` takes it."""

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any]
    options: dict[str, Any]


@dataclass
class Adopted:
    name: str
    instructions: str
    model: str | None  # a model name (None: AGENTRUNS_MODEL)
    model_instance: Any  # the agent's own pydantic_ai Model, when it has one
    model_settings: dict | None
    tools: list[ToolSpec] = field(default_factory=list)


def is_pydantic_agent(agent: Any) -> bool:
    return "pydantic_ai" in sys.modules and isinstance(agent, PydanticAgent)


def format_input(run_input: Any) -> str:
    """The user prompt of a run: its input's "message" (the whole input stays on the run)."""
    if isinstance(run_input, dict) and isinstance(run_input.get("message"), str):
        return run_input["message"]
    return json.dumps(run_input, sort_keys=True, ensure_ascii=False)


def _instructions(agent: PydanticAgent) -> str:
    """The agent's static instructions (its functions run in the agent's own loop, per run)."""
    parts = [str(p) for p in getattr(agent, "_system_prompts", ())]
    parts += [
        i.instruction for i in getattr(agent, "_instructions", ()) if isinstance(i.instruction, str)
    ]
    return "\n\n".join(p for p in parts if p)


def _model(agent: PydanticAgent) -> tuple[str | None, Any]:
    model = agent.model
    if model is None or isinstance(model, str):
        return model, None
    return f"{model.system}:{model.model_name}", model


def _as_declared(toolset: AbstractToolset, agent: PydanticAgent) -> AbstractToolset:
    """`toolset` as registration lists it, for the engine's tools and the permission snapshot:
    each tool as declared, its `prepare` function not run; a toolset function (`@agent.toolset`,
    `DynamicToolset`) asked once with no run (`ctx.deps` is None), so it names every tool it
    may offer. In a run both run in the agent's own loop at every step with the run's deps, and
    the run's snapshot bounds what the model is offered."""
    toolset = _unprepared(toolset)
    leaves: list[AbstractToolset] = []
    toolset.apply(leaves.append)
    if not any(
        isinstance(leaf, DynamicToolset)
        or (isinstance(leaf, FunctionToolset) and any(t.prepare for t in leaf.tools.values()))
        for leaf in leaves
    ):
        return toolset

    def declared(leaf: AbstractToolset) -> AbstractToolset:
        if isinstance(leaf, DynamicToolset):
            ctx = ToolsetBinding(toolset=leaf, agent=agent).listing_context()
            built = run_sync(_maybe_awaited(leaf.toolset_func(ctx)))
            return FunctionToolset() if built is None else _as_declared(built, agent)
        if not isinstance(leaf, FunctionToolset):
            return leaf
        bare = copy.copy(leaf)
        bare.tools = {name: copy.copy(tool) for name, tool in leaf.tools.items()}
        for tool in bare.tools.values():
            tool.prepare = None
        return bare

    return toolset.visit_and_replace(declared)


def _unprepared(toolset: AbstractToolset) -> AbstractToolset:
    """`toolset` without its `.prepared()` functions (which run per step in a run, where the
    run's snapshot bounds what they offer): registration lists every tool they may offer."""
    if type(toolset) is PreparedToolset:
        return _unprepared(toolset.wrapped)
    if isinstance(toolset, WrapperToolset):
        return dataclasses.replace(toolset, wrapped=_unprepared(toolset.wrapped))
    if isinstance(toolset, CombinedToolset):
        return dataclasses.replace(toolset, toolsets=[_unprepared(t) for t in toolset.toolsets])
    return toolset


async def _maybe_awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _is_mcp(toolset: AbstractToolset) -> bool:
    toolset = _unprepared(toolset)
    leaves: list[AbstractToolset] = []
    toolset.apply(leaves.append)
    return any(type(leaf).__name__ == "MCPToolset" for leaf in leaves)


def _options(
    agent_name: str,
    definition: ToolDefinition,
    binding: ToolsetBinding,
    override: Mapping[str, Any] | None,
) -> dict[str, Any]:
    where = f"Pydantic AI agent {agent_name!r}, tool {definition.name!r}"
    options: dict[str, Any] = {}
    if binding.mcp:
        options.update(annotation_defaults((definition.metadata or {}).get("annotations")))
        options["retry"] = MCP_RETRY
    options.update(declaration_of(definition.metadata, where=where))
    if override:
        options.update(check_declaration(override, where=where))
    if definition.kind == "unapproved":  # requires_approval=True: never weakened
        options["requires_approval"] = True
    if binding.mcp and options.get("transactional"):
        raise NotDurable(f"{where}: an MCP tool cannot be transactional (its effects are remote)")
    return options


def _spec(definition: ToolDefinition, binding: ToolsetBinding, options: dict) -> ToolSpec:
    def func(ctx: Any, **arguments: Any) -> Any:
        # the engine calls the tool through the agent's own toolset (runtime/engine/tools/)
        raise TypeError(
            f"{definition.name} is a tool of Pydantic AI agent {binding.agent.name!r}: it runs "
            "in a run of that agent, not by calling the registry Tool's func"
        )

    func.__name__ = definition.name
    return ToolSpec(
        name=definition.name,
        description=definition.description or "",
        parameters=dict(definition.parameters_json_schema),
        func=func,
        options=options,
    )


def adopt(
    agent: PydanticAgent,
    *,
    name: str | None = None,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    deps: Callable[[Any], Any] | None = None,
) -> Adopted:
    """Read `agent` into an engine agent. `tools`: per-tool declarations by (prefixed) name, over
    the tool's own metadata and an MCP tool's annotations; `deps`: the agent's deps from the run
    (`deps(run)`), for an agent with a `deps_type`. NotDurable for what cannot run durably."""
    agent_name = name or agent.name
    if not agent_name:
        raise NotDurable("a Pydantic AI agent needs a name= (runs and steps are keyed by it)")
    check_durable(agent, agent_name, has_deps=deps is not None)
    overrides = dict(tools or {})
    model, instance = _model(agent)
    adopted = Adopted(
        name=agent_name,
        instructions=_instructions(agent),
        model=model,
        model_instance=instance,
        # a function of the run context runs in the agent's own loop, per request
        model_settings=dict(agent.model_settings)
        if isinstance(agent.model_settings, Mapping)
        else None,
    )
    seen: set[str] = set()
    for toolset in agent.toolsets:
        binding = ToolsetBinding(
            toolset=_as_declared(toolset, agent), agent=agent, mcp=_is_mcp(toolset)
        )
        for definition in binding.discover().values():
            if definition.name in seen:
                raise NotDurable(
                    f"Pydantic AI agent {agent_name!r}: two tools named {definition.name!r}"
                )
            seen.add(definition.name)
            options = _options(
                agent_name, definition, binding, overrides.pop(definition.name, None)
            )
            adopted.tools.append(_spec(definition, binding, options))
            remember(definition.name, binding)
    if overrides:
        raise NotDurable(
            f"Pydantic AI agent {agent_name!r}: declarations for unknown tools {sorted(overrides)}"
        )
    return adopted
