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
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    DeferredLoadingToolset,
    DynamicToolset,
    ExternalToolset,
    FunctionToolset,
    PreparedToolset,
    WrapperToolset,
)


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
    if getattr(agent, "_validation_context", None) is not None:
        _refuse(
            name,
            "validation_context",
            "a tool's arguments are validated when its step runs, from the recorded call alone",
        )
    if getattr(agent, "_tool_timeout", None) is not None:
        _refuse(name, "tool_timeout", _NO_TIMEOUT)
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
_NO_TIMEOUT = (
    "the engine does not cut a call short (a call cut mid-way has an unknown outcome); give "
    "the tool's own client a timeout and raise RetryableToolError"
)


def check_toolset(name: str, toolset: AbstractToolset) -> None:
    """Raise NotDurable for the first part of `toolset` (wrappers and members included) that
    cannot run durably. Wrappers that only rename, prefix, filter (once, at registration), mark
    approvals or set metadata are fine: their calls go through them inside the tool step."""
    if type(toolset) is PreparedToolset:
        _refuse(name, "a prepared toolset (.prepared())", f"its function runs per step; {_FROZEN}")
    if isinstance(toolset, DeferredLoadingToolset):
        _refuse(name, "deferred loading (.defer_loading())", f"tools found mid-run; {_FROZEN}")
    if isinstance(toolset, DynamicToolset):
        _refuse(name, "toolset functions (DynamicToolset)", _FROZEN)
    if isinstance(toolset, ExternalToolset):
        _refuse(
            name,
            "ExternalToolset (deferred tools)",
            "their result comes from outside the run; use requires_approval for a person's "
            "decision",
        )
    if isinstance(toolset, FunctionToolset):
        for tool in toolset.tools.values():
            if tool.prepare is not None:
                _refuse(name, f"tool {tool.name!r} with a prepare function", _FROZEN)
            if tool.defer_loading:
                _refuse(name, f"tool {tool.name!r} with defer_loading", _FROZEN)
            if tool.timeout is not None:
                _refuse(name, f"tool {tool.name!r} with a timeout", _NO_TIMEOUT)
    if isinstance(toolset, WrapperToolset):
        check_toolset(name, toolset.wrapped)
    if isinstance(toolset, CombinedToolset):
        for member in toolset.toolsets:
            check_toolset(name, member)
