"""A registered agent as a run executes it: its Pydantic AI agent with our durability bound to
it, the model the run names, its user prompt, and (for the scripted model) what the engine
recorded for each tool call.

The durability is bound once per agent, when it registers (`registry.on_register`, hooked at
start-up), and handed to every run of it (`agent.run(capabilities=[...])`); a feature of the
agent that cannot be made durable is refused then, with the agent's name.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from agentruns.conf import conf
from agentruns.models import Run, Step, StepStatus
from agentruns.registry import Agent
from agentruns.runtime.engine.durability import AgentRunsDurability
from agentruns.runtime.providers.model_fallback import fallback_models

_bound: dict[int, tuple[Any, AgentRunsDurability]] = {}
_lock = threading.Lock()


def prepare(agent: Agent) -> None:
    prepared(agent)


def prepared(agent: Agent) -> tuple[Any, AgentRunsDurability]:
    """(the Pydantic AI agent, our durability bound to it) of a registered agent."""
    pa_agent = agent.pydantic_agent
    with _lock:
        found = _bound.get(id(pa_agent))
        if found is not None and found[0] is pa_agent:
            return found
    durability = AgentRunsDurability(name=agent.name, models=fallback_models(pa_agent))
    durability = durability.for_agent(pa_agent)
    assert isinstance(durability, AgentRunsDurability)
    with _lock:
        _bound[id(pa_agent)] = (pa_agent, durability)
    return pa_agent, durability


def model_selection(agent: Agent, run: Run) -> str | None:
    """The model the run names, as `agent.run(model=...)` takes it (None: the agent's own)."""
    name = run.model or agent.model or conf.MODEL
    if agent.model_instance is not None and name == agent.model:
        return None  # the agent's own Model instance
    return name


def prompt(agent: Agent, run: Run) -> str:
    """The run's input as the user prompt: a Pydantic AI agent's `message`, else the whole input
    as JSON (what the engine's agents and their scripted policies read)."""
    if callable(agent.format_input):
        return agent.format_input(run.input)
    return json.dumps(run.input, sort_keys=True, ensure_ascii=False)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def step_content(step: Step) -> str:
    """What a tool step says to the model in the engine's (scripted) conversation."""
    if step.status == StepStatus.SUCCEEDED:
        return _dumps(step.result)
    if step.status == StepStatus.REJECTED:
        return _dumps(step.result or {"error": "rejected", "reason": step.error})
    return _dumps({"error": step.error or step.status})


def tool_content(state: Any, call_id: str) -> str | None:
    """The engine-form content of a tool call of this run with a terminal step (its latest), or
    None. Each step's content is dumped once a slice."""
    step = state.by_call.get(call_id)
    if step is None or not step.is_terminal:
        return None
    key = (step.id, step.status, step.attempts)
    cache = state.step_contents
    if (content := cache.get(key)) is None:
        content = cache[key] = step_content(step)
    return content
