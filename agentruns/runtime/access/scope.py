"""A run acts only on what it was started for (DESIGN.md 4.13, issue 46).

A run's scope is its agent's `scope` of its input (`registry/run_input/scopes.py`), computed
when it starts (`scope_at_start`) and kept on the run (`Run.scope`), as its permissions are: a
thread's history, an earlier turn or the customer's text never widens it. A tool that declares `scope_arg` (frozen
into the run's tool snapshot) is called only with that argument equal to the run's scope:
`check_call` refuses any other call when the engine plans it, before any approval rule is asked,
so the model is told why (the step fails with the reason, as a tool outside the run's
permissions does, DESIGN.md 4.8), the run page shows the refused call, and no person is ever
asked to approve it. A run without a scope (its agent declares none, or it started before
scopes) and a tool without `scope_arg` are not bound.
"""

from __future__ import annotations

from typing import Any

from agentruns.models import Run
from agentruns.registry import ToolArgumentsError
from agentruns.registry.run_input.scopes import scope_of


class OutsideScope(ToolArgumentsError):
    """A call whose scoped argument names something other than the run's scope."""


def scope_at_start(agent: str, run_input: Any) -> str | int | None:
    """The scope a new run of `agent` with `run_input` keeps (BadScope, a ValueError, when the
    agent's declaration gives none: the start is refused)."""
    return scope_of(agent, run_input)


def check_call(run: Run, tool: str, arguments: dict) -> None:
    """Refuse (OutsideScope) a call of `tool` whose scoped argument is not the run's scope."""
    if run.scope is None:
        return
    arg = run.tool_policy(tool).get("scope_arg")
    if not arg:
        return
    named = arguments.get(arg)
    if arg in arguments and not isinstance(named, bool) and named == run.scope:
        return
    what = f"{arg} {named!r}" if arg in arguments else f"no {arg}"
    raise OutsideScope(
        f"{tool}: refused, {what} is outside this run's scope: it was started for "
        f"{run.scope!r} and acts on nothing else (start a run for that one instead)"
    )
