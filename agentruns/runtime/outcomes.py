"""When a run ends: its outcome and its hand-overs (what they are: registry/outcomes/).

`ending(run_id, change)` is called by `transitions.announce` with every change of a run's
status, inside the transaction that writes it (the executor's fenced commit or a service's), so
the outcome is written with the status that ends the run and a rolled-back end leaves nothing.
For a change that ends the run it

- opens an inbox item of kind `handover` (the runtime's inbox port) for each successful call of
  a tool declared `handover=True`, with a `approval.requested` event on the run's timeline;
  opening is idempotent per step, so a retried run that ends again opens none twice;
- sets the change's `outcome`: the agent's hook's answer, else `handed_over` after a hand-over,
  else "" (and says it on the `run.status` event).

It stays outside the executor's loop: the facts are the run's tool steps as committed. A hook
that raises (or answers something that is no outcome name) is logged and the default kept: an
outcome never fails the run's end (inside a transaction the hook runs in a savepoint, so a
failed query of its own never breaks the one that ends the run). Runs of agents that declare neither cost nothing here (no
read when the caller names the agent: the final answer's commit); an agent with hand-over tools
and no hook, one read of its hand-over steps; a hook, the run and its tool steps.
"""

from __future__ import annotations

import copy
import logging
import uuid
from contextlib import nullcontext
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet

from agentruns.models import TERMINAL_RUN_STATUSES, Run, Step, StepKind, StepStatus
from agentruns.registry import Agent, UnknownAgent, all_agents, get_agent, get_tool, has_tool
from agentruns.registry.outcomes import HANDED_OVER, OutcomeError, check_outcome_name
from agentruns.runtime.events import EventType
from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages.faults import is_infrastructure_error

log = logging.getLogger(__name__)


def handover_tools(agent: Agent) -> set[str]:
    """The agent's tools declared `handover=True` (as deployed)."""
    return {name for name in agent.tools if has_tool(name) and get_tool(name).handover}


def hands_over(agent_name: str, steps: list[Step]) -> bool:
    """Will this run's end open inbox items: did a hand-over call of it succeed (`steps`: the
    run's, as its executor holds them)? Its writer then ends the run inside a transaction, so
    the items commit with the end."""
    try:
        handing = handover_tools(get_agent(agent_name))
    except UnknownAgent:
        return False
    return any(s.tool in handing and s.status == StepStatus.SUCCEEDED for s in steps)


def _declaring(run_id: uuid.UUID | str, run: Run | None) -> Agent | None:
    """The run's agent, when it declares an outcome hook or a hand-over tool (None: nothing to
    do). Given the run, no read; else one, only while some agent declares either."""
    known = all_agents()
    if run is None:
        if not any(a.outcome is not None or handover_tools(a) for a in known.values()):
            return None
        run = Run.objects.filter(id=run_id).only("id", "agent", "input", "status").first()
    found = known.get(run.agent) if run is not None else None  # None: gone with a deploy
    if found is None or (found.outcome is None and not handover_tools(found)):
        return None
    return found


def ending(
    run_id: uuid.UUID | str,
    change: Any,
    *,
    run: Run | None = None,
    steps: list[Step] | None = None,
) -> None:
    """Complete `change` (a `transitions.RunChange`) that ends the run: see the module.
    `run` and `steps`: the run and all its steps as their caller holds them (the final answer's
    executor), else they are read."""
    if change.fields.get("status") not in TERMINAL_RUN_STATUSES:
        return
    declared = _declaring(run_id, run)
    if declared is None:
        return
    name, handing = declared.name, handover_tools(declared)
    if steps is not None:
        held = sorted((s for s in steps if s.kind == StepKind.TOOL), key=lambda s: s.index)
        tool_steps: QuerySet[Step] | None = None
    else:
        tool_steps = Step.objects.filter(run_id=run_id, kind=StepKind.TOOL).order_by("index")
    if declared.outcome is None:  # only hand-overs to look for: their steps alone
        if tool_steps is not None:
            held = list(tool_steps.filter(tool__in=handing, status=StepStatus.SUCCEEDED))
        handed = [s for s in held if s.tool in handing and s.status == StepStatus.SUCCEEDED]
        outcome = HANDED_OVER if handed else ""
    else:
        run = copy.copy(run) if run is not None else Run.objects.get(id=run_id)
        change.apply_to(run)  # the hook sees the run as it ends
        if tool_steps is not None:
            held = list(tool_steps)
        handed = [s for s in held if s.tool in handing and s.status == StepStatus.SUCCEEDED]
        outcome = _asked(declared, run, held, default=HANDED_OVER if handed else "")
    opened: list[tuple[str, dict] | None] = []
    if handed:
        with transaction.atomic():  # the items and their outbox rows together
            opened = [_opened(step, name) for step in handed]
    _say(change, outcome, [event for event in opened if event is not None])


def _asked(agent: Agent, run: Run, steps: list[Step], *, default: str) -> str:
    """The agent's hook's answer; `default` when it fails (in a savepoint: a failed query of
    the hook's never breaks the transaction that ends the run)."""
    try:
        # in the caller's transaction, a savepoint (autocommit needs none)
        with transaction.atomic() if connection.in_atomic_block else nullcontext():
            answer = agent.outcome(run, steps)
        return check_outcome_name(answer, where=f"agent {agent.name!r}: its outcome hook")
    except OutcomeError as exc:
        log.warning("run %s: %s", run.id, exc)
    except Exception as exc:
        if is_infrastructure_error(exc):
            raise  # weather: the run's end is not written now, and is again later
        log.warning("run %s: the outcome hook of %s failed: %r", run.id, agent.name, exc)
    return default


def _opened(step: Step, agent: str) -> tuple[str, dict] | None:
    """The hand-over's inbox item, and its timeline event (None: the step had one already)."""
    approval = inbox().open_handover(step, agent)
    if approval is None:
        return None
    data = {"step": step.index, "approval": approval, "kind": "handover", "tool": step.tool}
    return (EventType.APPROVAL_REQUESTED, data)


def _say(change: Any, outcome: str, before_status: list[tuple[str, dict]]) -> None:
    change.fields["outcome"] = outcome
    at = len(change.events)
    for i, (kind, data) in enumerate(change.events):
        if kind == EventType.RUN_STATUS:
            data["outcome"] = outcome
            at = i
    change.events[at:at] = before_status
