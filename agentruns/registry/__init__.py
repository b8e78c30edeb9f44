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

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from agentruns.registry import concurrency
from agentruns.registry.context import current_step
from agentruns.registry.durable import durable
from agentruns.registry.edits import Edit, EditRefused, check_declaration, check_edit
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
from agentruns.registry.retry import RetryPolicy
from agentruns.registry.schemas import (
    _simple_plan,
    _simple_valid,
    schema_from_signature,
    strict_validator,
)

# the edit policy (agentruns.registry.edits) and the strict validator are part of the plug-in API
__all__ = [
    "ApprovalRequested",
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
    "_simple_plan",
    "current_step",
    "durable",
    "schema_from_signature",
    "strict_validator",
]


@dataclass
class ToolContext:
    """What a tool receives besides its arguments."""

    run: Any
    step: Any
    attempt: int
    idempotency_key: str
    # the W3C trace context for the call's outgoing requests (send it as the `traceparent`
    # header): the tool's span when tracing is on, else the run's root span
    traceparent: str = ""


@dataclass
class Tool:
    name: str
    func: Callable[..., Any]
    description: str
    parameters: dict
    side_effect: bool = False
    idempotency: Literal["key", "none"] = "key"
    # its effects are rows in this database: it runs inside the step's own commit, so it happens
    # exactly once by atomicity (no "running" commit before it, nothing to resume)
    transactional: bool = False
    requires_approval: bool | Callable[[dict], bool] = False
    redact: Sequence[str] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # seconds a pending approval of this tool may wait before it escalates (None: the
    # AGENTRUNS_APPROVAL_ESCALATE_SECONDS default; 0: never)
    escalate_after: float | None = None
    # what an approver may change (agentruns.registry.edits); an argument not named here is fixed
    editable: Mapping[str, Edit] = field(default_factory=dict)
    # how many distinct people must approve a call that needs approval (a number, or a function
    # of the arguments); above 1 the run's starter never counts
    approvals_required: int | Callable[[dict], int] = 1
    # the argument that is this tool's amount, checked against approvers' limits
    amount_arg: str | None = None
    # across runs (registry/operations.py): the call's business key (at most one successful
    # execution per key), a limit over what calls add up to, and what an approver sees beside it
    operation_key: Callable[[dict], str] | None = None
    limit: Callable[[dict], OverLimit | str | None] | None = None
    context: Callable[[dict], dict] | None = None
    _compiled: Any = field(default=None, repr=False, compare=False)
    _simple: Any = field(default=None, repr=False, compare=False)

    @property
    def commits_before_call(self) -> bool:
        """A side effect outside this database: "running + attempt" is committed before the call."""
        return self.side_effect and not self.transactional

    def needs_approval(self, arguments: dict) -> bool:
        if callable(self.requires_approval):
            return bool(self.requires_approval(arguments))
        return bool(self.requires_approval)

    def approvals_for(self, arguments: dict) -> int:
        """How many approvals this call needs (when it needs approval at all): at least 1."""
        wanted = self.approvals_required
        return max(1, int(wanted(arguments) if callable(wanted) else wanted))

    def check_edit(self, requested: dict, proposed: dict) -> dict:
        """`proposed` (an approver's version of `requested`) against the edit policy and the
        schema; EditRefused names the field and the rule."""
        check_edit(self.parameters, self.editable, requested, proposed)
        try:
            return self.validate(proposed)
        except ToolArgumentsError as exc:
            raise EditRefused("arguments", "schema", str(exc)) from None

    def validate(self, arguments: Any) -> dict:
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(f"arguments for {self.name} must be a JSON object")
        validator = self._validator()
        if self._simple is not None and _simple_valid(self._simple, arguments):
            return arguments  # certainly valid; jsonschema is consulted for anything else
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolArgumentsError(f"{self.name}: {where}: {error.message}")
        return arguments

    def _validator(self) -> Any:
        # built once per tool: jsonschema.validate() re-checks the schema itself on every call
        if self._compiled is None:
            self._compiled = strict_validator(self.parameters)
            self._simple = _simple_plan(self.parameters)
        return self._compiled

    def schema(self) -> dict:
        """The OpenAI-style function schema the model sees."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def policy(self) -> dict:
        """What the run's tool snapshot keeps: enough to resume safely if the code changes."""
        return {
            "side_effect": self.side_effect,
            "idempotency": self.idempotency,
            "redact": list(self.redact),
            "retry": self.retry.describe(),
            "approval": "predicate"
            if callable(self.requires_approval)
            else bool(self.requires_approval),
            "transactional": self.transactional,
            "escalate_after": self.escalate_after,
            "approvals": "predicate"
            if callable(self.approvals_required)
            else self.approvals_required,
            "amount_arg": self.amount_arg,
            "editable": {name: edit.describe() for name, edit in self.editable.items()},
            # a run keeps whether its calls take an operation key (computed from the final
            # arguments when the call runs) and whether a limit applies
            "operation_key": self.operation_key is not None,
            "limit": self.limit is not None,
        }


_tools: dict[str, Tool] = {}
_agents: dict[str, Agent] = {}
_tool_owners: dict[str, str] = {}  # tool name -> the Pydantic AI agent whose tool it is


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict | None = None,
    side_effect: bool = False,
    idempotency: Literal["key", "none"] = "key",
    transactional: bool = False,
    requires_approval: bool | Callable[[dict], bool] = False,
    redact: Sequence[str] = (),
    retry: RetryPolicy | None = None,
    escalate_after: float | None = None,
    editable: Mapping[str, Edit] | None = None,
    approvals_required: int | Callable[[dict], int] = 1,
    amount_arg: str | None = None,
    operation_key: Callable[[dict], str] | None = None,
    limit: Callable[[dict], OverLimit | str | None] | None = None,
    context: Callable[[dict], dict] | None = None,
):
    """Register a function as a tool. Usable bare (`@tool`) or with options."""
    if idempotency not in ("key", "none"):
        raise ValueError("idempotency must be 'key' or 'none'")
    if escalate_after is not None and (isinstance(escalate_after, bool) or escalate_after < 0):
        raise ValueError("escalate_after must be a number of seconds >= 0 (0: never)")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        t = Tool(
            name=name or fn.__name__,
            func=fn,
            description=description or inspect.getdoc(fn) or "",
            parameters=parameters or schema_from_signature(fn),
            side_effect=side_effect or transactional,
            idempotency=idempotency,
            transactional=transactional,
            requires_approval=requires_approval,
            redact=tuple(redact),
            retry=retry or RetryPolicy(),
            escalate_after=escalate_after,
            editable=dict(editable or {}),
            approvals_required=approvals_required,
            amount_arg=amount_arg,
            operation_key=operation_key,
            limit=limit,
            context=context,
        )
        check_declaration(t.name, t.parameters, t.editable, t.redact, amount_arg)
        for what in ("operation_key", "limit", "context"):
            if getattr(t, what) is not None and not callable(getattr(t, what)):
                raise ValueError(f"{t.name}: {what} must be a function of the arguments")
        if operation_key is not None and not t.side_effect:
            raise ValueError(f"{t.name}: an operation_key is for a tool with a side effect")
        if not callable(approvals_required) and int(approvals_required) < 1:
            raise ValueError(f"{t.name}: approvals_required must be at least 1")
        _tools[t.name] = t
        fn.tool = t  # type: ignore[attr-defined]
        return fn

    return decorate(func) if func is not None else decorate


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
    # a Pydantic AI agent's (registry/pydantic_agents): its own pydantic_ai Model and settings,
    # and how the run's input becomes the user prompt
    model_instance: Any = field(default=None, repr=False, compare=False)
    model_settings: dict | None = None
    format_input: Callable[[Any], str] | None = field(default=None, repr=False, compare=False)
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
    `options`: Agent fields, e.g. `max_steps`; for either kind `concurrency.OPTIONS`)."""
    across_runs = concurrency.take(options)
    if not isinstance(agent, Agent):
        agent = _from_pydantic_ai(agent, tools=tools, deps=deps, **options)
    elif tools or deps or options:
        raise TypeError("tools=, deps= and options are for a pydantic_ai.Agent")
    for tool_name in agent.tools:
        get_tool(tool_name)  # fail at startup, not at run time
    if agent.retry_unknown not in ("refuse", "skip"):
        raise ValueError(f"agent {agent.name!r}: retry_unknown must be 'refuse' or 'skip'")
    if agent.model_instance is None:  # a provider SDK not installed: here, not mid-run
        check_model_name(agent.model)
    concurrency.declare(agent.name, across_runs)
    _agents[agent.name] = agent
    return agent


def _from_pydantic_ai(agent: Any, *, tools: Any, deps: Any, **options: Any) -> Agent:
    """The engine's Agent (and Tools) for a `pydantic_ai.Agent` (registry/pydantic_agents)."""
    if "pydantic_ai" not in type(agent).__module__:
        raise TypeError(f"register_agent takes an Agent or a pydantic_ai.Agent, not {agent!r}")
    from agentruns.registry.pydantic_agents import INPUT_SCHEMA, adopt, format_input

    adopted = adopt(agent, name=options.pop("name", None), tools=tools, deps=deps)
    for spec in adopted.tools:
        owner = _tool_owners.get(spec.name)
        if spec.name in _tools and owner != adopted.name:
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
        **{"format_input": format_input, **options},
    )


def get_agent(name: str) -> Agent:
    try:
        return _agents[name]
    except KeyError:
        raise UnknownAgent(f"unknown agent {name!r}") from None


def get_tool(name: str) -> Tool:
    try:
        return _tools[name]
    except KeyError:
        raise UnknownTool(f"unknown tool {name!r}") from None


def has_tool(name: str) -> bool:
    return name in _tools


def all_agents() -> dict[str, Agent]:
    return dict(_agents)
