"""The public registry: `@tool` and `Agent`.

Apps declare their tools and agents in `<app>/agents.py` (autodiscovered like `admin.py`):

    @tool(side_effect=True, idempotency="key", requires_approval=lambda a: a["amount_cents"] > 0)
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int, reason: str) -> dict: ...

    register_agent(Agent(name="refund", instructions="...", tools=["lookup_order", "issue_refund"]))

The runtime never imports the apps that use it; it only reads this registry.
"""

from __future__ import annotations

import inspect
import random
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema


class ToolError(Exception):
    """Base class for errors a tool raises on purpose."""


class RetryableToolError(ToolError):
    """A transient failure (timeout, 503): the engine retries with backoff, same idempotency key."""


class FatalToolError(ToolError):
    """A permanent failure: the step fails and so does the run, with this message kept."""


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema; fed back to the model."""


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    jitter: float = 0.25  # +- fraction of the delay
    retry_on: tuple[type[BaseException], ...] = (RetryableToolError,)

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on)

    def delay_for(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1`, after `attempt` failed (capped exponential)."""
        base = min(self.backoff_max_seconds, self.backoff_seconds * (2 ** max(0, attempt - 1)))
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))

    def describe(self) -> dict:
        return {
            "max_attempts": self.max_attempts,
            "backoff_seconds": self.backoff_seconds,
            "backoff_max_seconds": self.backoff_max_seconds,
            "jitter": self.jitter,
            "retry_on": [c.__name__ for c in self.retry_on],
        }


@dataclass
class ToolContext:
    """What a tool receives besides its arguments."""

    run: Any
    step: Any
    attempt: int
    idempotency_key: str


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
        }


def _strict_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 5.0 as an integer; an amount of 5.0 cents is a model's or a client's
    # mistake, not a value to store, and `true` is never a number
    return isinstance(instance, int) and not isinstance(instance, bool)


def strict_validator(schema: dict) -> Any:
    """A jsonschema validator for `schema` (its own draft, 2020-12 when it names none) whose
    "integer" takes only integers and which checks formats (uuid, date-time, ...)."""
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    base.check_schema(schema)
    strict = jsonschema.validators.extend(
        base, type_checker=base.TYPE_CHECKER.redefine("integer", _strict_integer)
    )
    return strict(schema, format_checker=base.FORMAT_CHECKER)


_SIMPLE_SCHEMA_KEYS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "title",
    "description",
}
_SIMPLE_PROPERTY_KEYS = {"type", "title", "description", "default"}  # default: an annotation
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _simple_plan(schema: dict) -> tuple[dict, frozenset, bool] | None:
    """For the common schema (an object of typed scalar properties, nothing else): what a
    hand-written check needs. jsonschema costs ~70 us per call; this a few. None: not simple."""
    if schema.get("type") != "object" or not set(schema) <= _SIMPLE_SCHEMA_KEYS:
        return None
    checks = {}
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, dict) or not set(prop) <= _SIMPLE_PROPERTY_KEYS:
            return None
        check = _TYPE_CHECKS.get(prop.get("type"))  # type: ignore[arg-type]
        if check is None:
            return None
        checks[name] = check
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        return None
    return checks, frozenset(schema.get("required") or ()), extra


def _simple_valid(plan: tuple[dict, frozenset, bool], arguments: dict) -> bool:
    checks, required, extra_allowed = plan
    if not required <= arguments.keys():
        return False
    for key, value in arguments.items():
        check = checks.get(key)
        if check is None:
            if not extra_allowed:
                return False
        elif not check(value):
            return False
    return True


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(annotation: Any) -> dict:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            inner = _schema_for(non_null[0])
            if "type" in inner:
                return {**inner, "type": [inner["type"], "null"]}
            return inner
        return {"anyOf": [_schema_for(a) for a in non_null]}
    if annotation is list or origin is list:
        return {"type": "array", "items": _schema_for(args[0])} if args else {"type": "array"}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    return {}


def schema_from_signature(func: Callable[..., Any]) -> dict:
    """JSON schema of a tool's arguments from its type hints (first parameter is the context)."""
    hints = typing.get_type_hints(func)
    params = list(inspect.signature(func).parameters.values())[1:]
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in params:
        prop = _schema_for(hints.get(param.name, Any))
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            prop["default"] = param.default
        properties[param.name] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_tools: dict[str, Tool] = {}
_agents: dict[str, Agent] = {}


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
        )
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
    # for the offline `scripted` provider: decides the next turn from the conversation
    scripted_policy: Callable[[list[dict]], ScriptedTurn] | None = None
    # input keys copied into Run.search_text (order id, ticket id) for the runs list search
    search_fields: Sequence[str] = ()
    input_schema: dict | None = None
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


def register_agent(agent: Agent) -> Agent:
    for tool_name in agent.tools:
        get_tool(tool_name)  # fail at startup, not at run time
    _agents[agent.name] = agent
    return agent


class UnknownAgent(LookupError):
    pass


class UnknownTool(LookupError):
    pass


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


def all_agents() -> dict[str, Agent]:
    return dict(_agents)
