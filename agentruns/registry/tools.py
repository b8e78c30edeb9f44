"""The engine's tools: `@tool`, the `Tool` each registered function becomes (its policy: side
effect, idempotency, approvals, edits, redaction, retries, operation keys and limits, currency,
hand-over, the argument bound to the run's scope) and its `RetryPolicy`. Re-exported by
`agentruns.registry`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from agentruns import backoff
from agentruns.registry.edits import Edit, EditRefused, check_declaration, check_edit
from agentruns.registry.errors import RetryableToolError, ToolArgumentsError, UnknownTool
from agentruns.registry.operations import OverLimit
from agentruns.registry.schemas import (
    schema_from_signature,
    simple_plan,
    simple_valid,
    strict_validator,
)


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
        return backoff.delay(
            attempt, base=self.backoff_seconds, cap=self.backoff_max_seconds, jitter=self.jitter
        )

    def describe(self) -> dict:
        return {
            "max_attempts": self.max_attempts,
            "backoff_seconds": self.backoff_seconds,
            "backoff_max_seconds": self.backoff_max_seconds,
            "jitter": self.jitter,
            "retry_on": [c.__name__ for c in self.retry_on],
        }


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
    # the argument holding the currency of `amount_arg` (else the context's `currency`)
    currency_arg: str | None = None
    handover: bool = False  # a call hands the run over to a person (registry/outcomes/)
    # called with a `HandoverClosed` when a person closes one of its hand-overs, inside the
    # transaction that closes it (registry/outcomes/)
    handover_closed: Callable[[Any], None] | None = None
    # the argument that must equal the run's scope (registry/run_input/scopes.py): a call with
    # another value is refused
    scope_arg: str | None = None
    # what a call does, as a verb phrase for people ("refund"): pages say "Waiting for an
    # approver: refund 327.32 USD to Jun Sato" (selectors/calls.py); default: the name in words
    label: str = ""
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
        if self._simple is not None and simple_valid(self._simple, arguments):
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
            self._simple = simple_plan(self.parameters)
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
            # the argument bound to the run's scope, frozen with the run like the rest
            "scope_arg": self.scope_arg,
        }


_tools: dict[str, Tool] = {}


def check_scope_arg(t: Tool) -> None:
    """A `scope_arg` names one of the tool's arguments, and one no approver may edit (an edit
    could move the call out of the run's scope after it was checked)."""
    arg = t.scope_arg
    if arg is None:
        return
    if not isinstance(arg, str) or arg not in (t.parameters.get("properties") or {}):
        raise ValueError(f"{t.name}: scope_arg {arg!r} is not one of its arguments")
    if arg in t.editable:
        raise ValueError(f"{t.name}: its scope_arg {arg!r} may not be editable")


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
    currency_arg: str | None = None,
    handover: bool = False,
    handover_closed: Callable[[Any], None] | None = None,
    scope_arg: str | None = None,
    label: str = "",
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
            currency_arg=currency_arg,
            handover=bool(handover),
            handover_closed=handover_closed,
            scope_arg=scope_arg,
            label=str(label or ""),
        )
        check_declaration(t.name, t.parameters, t.editable, t.redact, amount_arg, currency_arg)
        for what in ("operation_key", "limit", "context"):
            if getattr(t, what) is not None and not callable(getattr(t, what)):
                raise ValueError(f"{t.name}: {what} must be a function of the arguments")
        if handover_closed is not None and not (handover and callable(handover_closed)):
            raise ValueError(
                f"{t.name}: handover_closed is a function, for a tool declared handover=True"
            )
        check_scope_arg(t)
        if operation_key is not None and not t.side_effect:
            raise ValueError(f"{t.name}: an operation_key is for a tool with a side effect")
        if not callable(approvals_required) and int(approvals_required) < 1:
            raise ValueError(f"{t.name}: approvals_required must be at least 1")
        _tools[t.name] = t
        fn.tool = t  # type: ignore[attr-defined]
        return fn

    return decorate(func) if func is not None else decorate


def get_tool(name: str) -> Tool:
    try:
        return _tools[name]
    except KeyError:
        raise UnknownTool(f"unknown tool {name!r}") from None


def has_tool(name: str) -> bool:
    return name in _tools
