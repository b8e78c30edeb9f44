"""The Pydantic AI features a durable run cannot carry, refused when the agent is registered.

Each refusal names the feature and why, so the error is the documentation (docs/pydantic-ai.md
lists them all). A run executes the agent's own loop with every I/O a recorded step
(`runtime/engine/`), so almost everything runs; what is refused is what would change the
run's tools after its permission snapshot froze them (deferred loading), or a second durable
engine.
"""

from __future__ import annotations

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.capabilities.abstract import leaf_capabilities
from pydantic_ai.durable_exec import BaseDurabilityCapability
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    DeferredLoadingToolset,
    FunctionToolset,
    WrapperToolset,
)


class NotDurable(ValueError):
    """A feature of this Pydantic AI agent cannot run durably (the message says which)."""


def _refuse(agent_name: str, feature: str, why: str) -> None:
    raise NotDurable(f"Pydantic AI agent {agent_name!r}: {feature} cannot run durably: {why}")


def check_durable(agent: PydanticAgent, name: str, *, has_deps: bool) -> None:
    """Raise NotDurable for the first feature of `agent` the engine cannot make durable.

    The agent's own loop runs each slice (`runtime/engine/`), so structured output, output
    validators, instruction and model settings functions, capabilities, dynamic toolsets,
    `prepare`, `validation_context`, timeouts and deferred tools run as they do in
    `agent.run()`, each I/O a recorded step; what is refused here has a reason of its own."""
    others = [
        type(c).__name__
        for c in leaf_capabilities(agent.root_capability)
        if isinstance(c, BaseDurabilityCapability)
    ]
    if others:
        _refuse(
            name,
            f"capabilities {others}",
            "a run has one durable engine: its runs are already durable steps here",
        )
    for toolset in agent.toolsets:
        if not isinstance(toolset, AbstractToolset):
            _refuse(name, f"toolset {toolset!r}", "not a Pydantic AI toolset")
        check_toolset(name, toolset)
    if agent.deps_type not in (object, type(None)) and not has_deps:
        _refuse(
            name,
            f"deps_type {agent.deps_type!r} without deps=",
            "register it with deps=<function of the run> so every step can rebuild its deps",
        )


_FROZEN = "the run's tools are frozen when it starts (its permission snapshot names them)"


def check_toolset(name: str, toolset: AbstractToolset) -> None:
    """Raise NotDurable for the first part of `toolset` (wrappers and members included) that
    cannot run durably."""
    # (Pydantic AI's tool search adds its own tool and reveals tools per request, outside the
    # tools the registry and the snapshot name: not a limit of durable execution, work left)
    if isinstance(toolset, DeferredLoadingToolset):
        _refuse(name, "deferred loading (.defer_loading())", f"tools found mid-run; {_FROZEN}")
    if isinstance(toolset, FunctionToolset):
        for tool in toolset.tools.values():
            if tool.defer_loading:
                _refuse(name, f"tool {tool.name!r} with defer_loading", _FROZEN)
    if isinstance(toolset, WrapperToolset):
        check_toolset(name, toolset.wrapped)
    if isinstance(toolset, CombinedToolset):
        for member in toolset.toolsets:
            check_toolset(name, member)
