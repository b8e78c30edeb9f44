"""The public registry: `@tool` and `Agent`.

Apps declare their tools and agents in `<app>/agents.py` (autodiscovered like `admin.py`):

    @tool(side_effect=True, idempotency="key", requires_approval=lambda a: a["amount_cents"] > 0,
          approvals_required=lambda a: 2 if a["amount_cents"] > 50_000 else 1,
          editable={"amount_cents": Edit.at_most_requested(minimum=1), "reason": Edit.free()},
          amount_arg="amount_cents")
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int, reason: str) -> dict: ...

    register_agent(Agent(name="refund", instructions="...", tools=["lookup_order", "issue_refund"]))

The runtime never imports the apps that use it; it only reads this registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from agentruns.registry.context import ToolContext, current_step
from agentruns.registry.durable import durable
from agentruns.registry.edits import Edit, EditRefused
from agentruns.registry.errors import (
    ApprovalRequested,
    FatalToolError,
    OutcomeUnknown,
    RetryableToolError,
    ServerUnavailable,
    ToolArgumentsError,
    ToolError,
    UnknownAgent,
    UnknownTool,
)
from agentruns.registry.model_names import check_model_name
from agentruns.registry.operations import OperationKeyError, OverLimit
from agentruns.registry.outcomes import check_declaration as check_outcomes
from agentruns.registry.run_input import concurrency, scopes
from agentruns.registry.schemas import schema_from_signature, simple_plan, strict_validator
from agentruns.registry.tools import RetryPolicy, Tool, get_tool, has_tool, tool
from agentruns.registry.waits import (
    EventTimedOut,
    EventWaitFailed,
    NotAConversation,
    TokenHeld,
    ask_customer,
    ask_human,
    shared_tool_names,
    sleep_for,
    sleep_until,
    wait_for_event,
    wait_for_message,
    wait_tools,
)

# the edit policy (agentruns.registry.edits) and the strict validator are part of the plug-in API
__all__ = [
    "ApprovalRequested",
    "RetryPolicy",
    "Tool",
    "ToolContext",
    "UnknownTool",
    "get_tool",
    "has_tool",
    "tool",
    "Edit",
    "EditRefused",
    "FatalToolError",
    "OperationKeyError",
    "OutcomeUnknown",
    "OverLimit",
    "RetryPolicy",
    "RetryableToolError",
    "ServerUnavailable",
    "ToolArgumentsError",
    "ToolError",
    "simple_plan",
    "current_step",
    "durable",
    "schema_from_signature",
    "strict_validator",
    # waits (registry/waits): the model's toolset and what tool code calls
    "EventTimedOut",
    "EventWaitFailed",
    "NotAConversation",
    "TokenHeld",
    "ask_customer",
    "ask_human",
    "sleep_for",
    "sleep_until",
    "wait_for_event",
    "wait_for_message",
    "wait_tools",
]


_agents: dict[str, Agent] = {}
_tool_owners: dict[str, str] = {}  # tool name -> the Pydantic AI agent whose tool it is


@dataclass
class ScriptedTurn:
    """What an agent's `scripted_policy` answers for the offline `scripted` model: the text of
    the turn and the tool calls it asks for (arguments as a dict, or a string of raw JSON)."""

    text: str = ""
    tool_calls: list[tuple[str, dict | str]] = field(default_factory=list)


@dataclass
class Agent:
    name: str
    instructions: str
    tools: Sequence[str] = ()
    model: str | None = None  # None: conf.MODEL
    max_steps: int | None = None  # None: conf.DEFAULT_MAX_STEPS
    token_budget: int | None = None
    max_cost_usd: float | None = None  # None: conf.MAX_COST_USD (0: no limit)
    deadline_seconds: float | None = None
    retry_unknown: Literal["refuse", "skip"] = "refuse"  # a retry and an unknown outcome
    # for the offline `scripted` provider: decides the next turn from the conversation (and, if
    # it takes a `tools` keyword, from the names of the tools this run offers)
    scripted_policy: Callable[..., ScriptedTurn] | None = None
    # input keys copied into Run.search_text (order id, ticket id) for the runs list search
    search_fields: Sequence[str] = ()
    # tool -> its argument with the words it sends the run's customer (the run page's reply)
    replies: Mapping[str, str] = field(default_factory=dict)
    input_schema: dict | None = None
    # what a run's work came to, when it ends, and each outcome's tone (registry/outcomes/)
    outcome: Callable[[Any, list], str | None] | None = field(default=None, repr=False)
    outcomes: Mapping[str, str] = field(default_factory=dict)
    # a Pydantic AI agent's (registry/pydantic_agents): its own pydantic_ai Model and settings,
    # and how the run's input becomes the user prompt
    model_instance: Any = field(default=None, repr=False, compare=False)
    model_settings: dict | None = None
    format_input: Callable[[Any], str] | None = field(default=None, repr=False, compare=False)
    # the Pydantic AI agent a run executes (its own loop, made durable by the runtime): the one
    # registered, or the one these declarations build (registry/pydantic_agents/native.py)
    pydantic_agent: Any = field(default=None, repr=False, compare=False)
    # its deps from the run (`register_agent(agent, deps=lambda run: ...)`)
    deps: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)
    _input_validator: Any = field(default=None, repr=False, compare=False)

    def tool_objects(self) -> list[Tool]:
        return [get_tool(n) for n in self.tools]

    def validate_input(self, run_input: Any) -> dict:
        """The run's input against `input_schema` (validator built once); ValueError if not."""
        if not isinstance(run_input, dict):
            raise ValueError("input must be a JSON object")
        if self.input_schema is None:
            return run_input
        if self._input_validator is None:
            self._input_validator = strict_validator(self.input_schema)
        error = jsonschema.exceptions.best_match(self._input_validator.iter_errors(run_input))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "input"
            raise ValueError(f"{where}: {error.message}")
        return run_input


def register_agent(
    agent: Any,
    *,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    deps: Callable[[Any], Any] | None = None,
    **options: Any,
) -> Agent:
    """Register an `Agent`, or a `pydantic_ai.Agent` (then `tools`: per-tool declarations by
    name, over each tool's metadata["agentruns"]; `deps`: its deps from the run, `deps(run)`;
    `options`: Agent fields, e.g. `max_steps`; for either kind `concurrency.OPTIONS` and
    `scopes.OPTIONS`: `scope=lambda input: ...`, what a run is about)."""
    across_runs = concurrency.take(options)
    bound = scopes.take(options)
    if not isinstance(agent, Agent):
        agent = _from_pydantic_ai(agent, tools=tools, deps=deps, **options)
    elif tools or deps or options:
        raise TypeError("tools=, deps= and options are for a pydantic_ai.Agent")
    for tool_name in agent.tools:
        get_tool(tool_name)  # fail at startup, not at run time
    agent.outcomes = check_outcomes(agent.name, agent.outcome, agent.outcomes)
    if agent.retry_unknown not in ("refuse", "skip"):
        raise ValueError(f"agent {agent.name!r}: retry_unknown must be 'refuse' or 'skip'")
    if agent.model_instance is None:  # a provider SDK not installed: here, not mid-run
        check_model_name(agent.model)
    concurrency.declare(agent.name, across_runs)
    scopes.declare(agent.name, bound)
    if agent.pydantic_agent is None:  # declared with @tool and Agent: the agent they build
        from agentruns.registry.pydantic_agents.native import build

        agent.pydantic_agent = build(agent, [get_tool(name) for name in agent.tools])
    for prepare in _on_register:
        prepare(agent)  # the runtime binds its durability now: a refusal names the agent here
    _agents[agent.name] = agent
    return agent


# what the runtime does with each agent as it registers (`on_register`)
_on_register: list[Callable[[Agent], None]] = []


def on_register(prepare: Callable[[Agent], None]) -> None:
    """The runtime's hook (set at start-up): `prepare(agent)` for each agent registered from now
    on, and for those registered already."""
    _on_register.append(prepare)
    for agent in list(_agents.values()):
        prepare(agent)


def _from_pydantic_ai(agent: Any, *, tools: Any, deps: Any, **options: Any) -> Agent:
    """The engine's Agent (and Tools) for a `pydantic_ai.Agent` (registry/pydantic_agents)."""
    if "pydantic_ai" not in type(agent).__module__:
        raise TypeError(f"register_agent takes an Agent or a pydantic_ai.Agent, not {agent!r}")
    from agentruns.registry.pydantic_agents import INPUT_SCHEMA, adopt, format_input

    adopted = adopt(agent, name=options.pop("name", None), tools=tools, deps=deps)
    for spec in adopted.tools:
        owner = _tool_owners.get(spec.name)
        if has_tool(spec.name) and owner != adopted.name and spec.name not in shared_tool_names():
            raise ValueError(
                f"Pydantic AI agent {adopted.name!r}: a tool named {spec.name!r} is already "
                f"registered (by {owner or 'an @tool'}); tool names are global (tool policies "
                "and snapshots name them): give the toolset a prefix (toolset.prefixed(...))"
            )
        _tool_owners[spec.name] = adopted.name
        declared = dict(spec.options)
        if isinstance(declared.get("retry"), Mapping):
            declared["retry"] = RetryPolicy(**declared["retry"])
        tool(
            spec.func,
            name=spec.name,
            description=spec.description,
            **declared,
            parameters=spec.parameters,
        )
    options.setdefault("input_schema", INPUT_SCHEMA)
    return Agent(
        name=adopted.name,
        instructions=adopted.instructions,
        tools=[spec.name for spec in adopted.tools],
        model=adopted.model,
        model_instance=adopted.model_instance,
        model_settings=adopted.model_settings,
        pydantic_agent=agent,
        deps=deps,
        **{"format_input": format_input, **options},
    )


def get_agent(name: str) -> Agent:
    try:
        return _agents[name]
    except KeyError:
        raise UnknownAgent(f"unknown agent {name!r}") from None


def all_agents() -> dict[str, Agent]:
    return dict(_agents)
