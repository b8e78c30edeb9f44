"""When a run ends: its outcome and its hand-overs (what they are: registry/outcomes.py).

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
outcome never fails the run's end. Runs of agents that declare neither cost nothing here.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction

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


def writes_at_end(agent_name: str) -> bool:
    """May a run of this agent open inbox items when it ends (it has a hand-over tool)? Its
    writer then ends the run inside a transaction, so the items commit with the end."""
    try:
        return bool(handover_tools(get_agent(agent_name)))
    except UnknownAgent:
        return False


def _declares(agents: list[Agent]) -> bool:
    """Does any of these agents declare an outcome hook or a hand-over tool? (no: no reads)"""
    return any(a.outcome is not None or handover_tools(a) for a in agents)


def ending(run_id: uuid.UUID | str, change: Any, *, agent: str = "") -> None:
    """Complete `change` (a `transitions.RunChange`) that ends the run: see the module.
    `agent`: the run's, when the caller knows it (no read for an agent that declares none)."""
    status = change.fields.get("status")
    if status not in TERMINAL_RUN_STATUSES:
        return
    known = all_agents()
    if not _declares([known[agent]] if agent in known else list(known.values())):
        return
    run = Run.objects.filter(id=run_id).only("id", "agent", "input", "status").first()
    if run is None:
        return
    try:
        agent = get_agent(run.agent)
    except UnknownAgent:  # a deploy removed it: nobody to ask
        return
    handing = handover_tools(agent)
    if agent.outcome is None and not handing:
        return
    change.apply_to(run)  # the hook sees the run as it ends
    steps = list(Step.objects.filter(run_id=run.id, kind=StepKind.TOOL).order_by("index"))
    handed = [s for s in steps if s.tool in handing and s.status == StepStatus.SUCCEEDED]
    outcome = HANDED_OVER if handed else ""
    if agent.outcome is not None:
        outcome = _asked(agent, run, steps, default=outcome)
    opened = [_opened(step, run) for step in handed]
    _say(change, outcome, [event for event in opened if event is not None])


def _asked(agent: Agent, run: Run, steps: list[Step], *, default: str) -> str:
    """The agent's hook's answer; `default` when it fails (in a savepoint: a failed query of
    the hook's never breaks the transaction that ends the run)."""
    try:
        with transaction.atomic():
            answer = agent.outcome(run, steps)
        return check_outcome_name(answer, where=f"agent {agent.name!r}: its outcome hook")
    except OutcomeError as exc:
        log.warning("run %s: %s", run.id, exc)
    except Exception as exc:
        if is_infrastructure_error(exc):
            raise  # weather: the run's end is not written now, and is again later
        log.warning("run %s: the outcome hook of %s failed: %r", run.id, agent.name, exc)
    return default


def _opened(step: Step, run: Run) -> tuple[str, dict] | None:
    """The hand-over's inbox item, and its timeline event (None: the step had one already)."""
    approval = inbox().open_handover(step, run.agent)
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
