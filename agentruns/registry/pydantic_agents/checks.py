"""The Pydantic AI features a durable run cannot carry, refused when the agent is registered.

Each refusal names the feature and why, so the error is the documentation (docs/pydantic-ai.md
lists them all). The engine drives the run itself (every model request a model step, every tool
call a tool step, the conversation rebuilt from the steps), so anything that only lives inside
one `agent.run()` call, or that runs code between steps the engine cannot record, is refused.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import DeferredToolRequests
from pydantic_ai.toolsets import AbstractToolset


class NotDurable(ValueError):
    """A feature of this Pydantic AI agent cannot run durably (the message says which)."""


@functools.cache
def _default_capability_types() -> frozenset[type]:
    """The capabilities every Pydantic AI agent gets without asking (tool search, ...)."""
    plain = PydanticAgent(defer_model_check=True)
    return frozenset(type(c) for c in getattr(plain.root_capability, "capabilities", ()))


def _refuse(agent_name: str, feature: str, why: str) -> None:
    raise NotDurable(f"Pydantic AI agent {agent_name!r}: {feature} cannot run durably: {why}")


def _output_types(output_type: Any) -> list[Any]:
    return list(output_type) if isinstance(output_type, list | tuple) else [output_type]


def check_durable(agent: PydanticAgent, name: str, *, has_deps: bool) -> None:
    """Raise NotDurable for the first feature of `agent` the engine cannot make durable."""
    for kind in _output_types(agent.output_type):
        if kind not in (str, DeferredToolRequests):
            _refuse(
                name,
                f"output_type {kind!r}",
                "only text output (str, optionally with DeferredToolRequests) is supported; "
                "structured output would be a final tool the engine does not plan as a step",
            )
    if getattr(agent, "_output_validators", None):
        _refuse(name, "output validators", "they re-run the model outside a recorded step")
    if getattr(agent, "_system_prompt_functions", None) or any(
        callable(getattr(i, "instruction", None)) for i in getattr(agent, "_instructions", ())
    ):
        _refuse(
            name,
            "instruction/system prompt functions",
            "the conversation is rebuilt from the steps, so instructions must be static text",
        )
    if agent.event_stream_handler is not None:
        _refuse(
            name,
            "event_stream_handler",
            "the run's events are the stream (run page, socket, AI SDK stream); "
            "read them there instead",
        )
    if callable(agent.model_settings):
        _refuse(name, "model_settings as a function", "pass a static ModelSettings dict")
    extra = [
        type(c).__name__
        for c in getattr(agent.root_capability, "capabilities", ())
        if type(c) not in _default_capability_types()
    ]
    if extra:
        _refuse(
            name,
            f"capabilities {extra}",
            "capability hooks run inside agent.run(), which the engine does not call "
            "(history processors, model fallback hooks, ... are refused with them)",
        )
    if getattr(agent, "_dynamic_toolsets", None):
        _refuse(
            name,
            "toolset functions (DynamicToolset)",
            "the run's tool snapshot is frozen when it starts; pass the toolset itself",
        )
    for toolset in agent.toolsets:
        if not isinstance(toolset, AbstractToolset):
            _refuse(name, f"toolset {toolset!r}", "not a Pydantic AI toolset")
    if agent.deps_type not in (object, type(None)) and not has_deps:
        _refuse(
            name,
            f"deps_type {agent.deps_type!r} without deps=",
            "register it with deps=<function of the run> so every step can rebuild its deps",
        )
