"""What a run is about, and which of a tool's arguments must name it (DESIGN.md 4.13, issue 46):

    register_agent(agent, scope=lambda input: input["order_id"])

    @tool(side_effect=True, scope_arg="order_id")        # native
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict: ...

    @agent.tool_plain(metadata=durable(side_effect=True, scope_arg="order_id"))  # Pydantic AI

A run's scope is its agent's `scope` of its input, computed once when the run starts and kept on
the run: whatever its history, a thread's earlier messages or the customer's text say later,
a call of a tool that declares `scope_arg` is made only when that argument equals the run's
scope; any other call is refused when it is planned (the model is told why, as for a tool outside
the run's permissions), so no approver ever sees it. The runtime enforces it
(`agentruns/runtime/access/scope.py`); this module keeps the agents' declarations, checked at
start-up, for an `Agent` and a `pydantic_ai.Agent` alike (a tool's `scope_arg` is a `Tool`
field, `registry/tools.py`).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

OPTIONS = ("scope",)
SCOPE_MAX = 200  # characters of a scope that is a string


class BadScope(ValueError):
    """The agent's `scope` gives no usable value for this input (the start is refused)."""


_declared: dict[str, Callable[[Any], Any]] = {}


def take(options: MutableMapping[str, Any]) -> dict[str, Any]:
    """Pop this module's keywords out of `register_agent`'s options."""
    return {name: options.pop(name) for name in OPTIONS if name in options}


def declare(agent: str, options: dict[str, Any]) -> None:
    """Keep (or, registered again without it, forget) the agent's `scope`."""
    scope = options.get("scope")
    if scope is None:
        _declared.pop(agent, None)
        return
    if not callable(scope):
        raise TypeError(f"agent {agent!r}: scope must be a function of the run's input")
    _declared[agent] = scope


def scope_of(agent: str, run_input: Any) -> str | int | None:
    """The scope of a run of `agent` with `run_input` (None: the agent declares none). An agent
    that declares one binds every run: a function that fails, or gives anything but a non-empty
    printable string or an integer, refuses the start (BadScope), never an unbounded run."""
    declared = _declared.get(agent)
    if declared is None:
        return None
    try:
        value = declared(run_input)
    except Exception as exc:  # the input lacks what the scope is made of: the caller's 400
        raise BadScope(f"scope: {type(exc).__name__}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadScope(f"scope: must be a string or an integer, not {type(value).__name__}")
    if isinstance(value, str) and (not value or len(value) > SCOPE_MAX or not value.isprintable()):
        raise BadScope(f"scope: must be 1 to {SCOPE_MAX} printable characters")
    return value
