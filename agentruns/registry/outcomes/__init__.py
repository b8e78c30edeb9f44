"""What a run achieved, beside its status (`Run.outcome`), as its agent declares it:

    register_agent(agent, outcome=refund_outcome,
                   outcomes={"refunded": "positive", "refund_rejected": "negative"})

`outcome(run, steps)` is called once when the run ends (succeeded, failed or cancelled), inside
the transaction that ends it, with the run (its new status set) and its tool steps in order. It
answers a short name (`[a-z][a-z0-9_]*`, at most 40 characters), or None / "" for none. A run's
status says whether the engine finished the work; its outcome says what the work came to (a
refund rejected by a person is a run that `succeeded` with the outcome `refund_rejected`).
`outcomes` lists the names the hook may answer, each with its tone for people (the runs list's
colour and its filter's choices): positive, negative, attention or neutral.

A tool declared `handover=True` hands the run's request over to a person (the demo's trainee
runs, which may not refund): when the run ends, each of its successful calls opens an inbox
item of kind `handover` (the runtime's inbox port), and without a hook of its own the run's
outcome is `handed_over`. An agent without a hook and without a hand-over has no outcome: the
engine cannot know what a generic run's work came to, and its status already says it ended.
A hand-over tool may declare `handover_closed=fn`: when a person closes one of its items, `fn`
is called with a `HandoverClosed` inside the transaction that closes it (its writes commit with
the close, and its error undoes it), so the domain's own record of the request (the demo's
ticket) says who finished it, whichever door closed it (the inbox, the API, the domain's page).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

HANDED_OVER = "handed_over"
TONES = ("positive", "negative", "attention", "neutral")
# the outcomes the engine itself gives (a hand-over), with their tones
ENGINE_OUTCOMES = {HANDED_OVER: "attention"}
MAX_LENGTH = 40  # Run.outcome's
_NAME = re.compile(rf"^[a-z][a-z0-9_]{{0,{MAX_LENGTH - 1}}}$")


@dataclass(frozen=True)
class HandoverClosed:
    """A person closed a hand-over: what a tool's `handover_closed` hook is told."""

    run_id: Any
    tool: str
    arguments: dict  # the hand-over call's arguments
    run_input: dict  # the input of the run that handed over
    closed_by: Any  # the user who closed it (None: nobody signed in)
    closed_at: datetime
    reason: str  # the words they gave for the record
    internal_note: str  # staff's only


class OutcomeError(ValueError):
    """An outcome hook answered something that is not an outcome name."""


def check_outcome_name(value: Any, *, where: str) -> str:
    """`value` as an outcome ("" for None or ""); OutcomeError for anything else."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _NAME.match(value):
        raise OutcomeError(
            f"{where}: an outcome is a name of [a-z0-9_] starting with a letter, at most "
            f"{MAX_LENGTH} characters (got {value!r})"
        )
    return value


def check_declaration(
    agent: str, hook: Callable[..., Any] | None, outcomes: Mapping[str, str]
) -> dict[str, str]:
    """At registration: a callable hook and a name -> tone mapping of valid names and tones."""
    if hook is not None and not callable(hook):
        raise ValueError(f"agent {agent!r}: outcome must be a function of (run, steps)")
    checked: dict[str, str] = {}
    for name, tone in dict(outcomes).items():
        check_outcome_name(name, where=f"agent {agent!r}: outcomes")
        if tone not in TONES:
            raise ValueError(
                f"agent {agent!r}: outcome {name!r} has tone {tone!r}, not one of {TONES}"
            )
        checked[name] = tone
    return checked


def tones(agents: Iterable[Any]) -> dict[str, str]:
    """Every outcome these agents (`all_agents().values()`) or the engine may give a run, with
    its tone."""
    found = dict(ENGINE_OUTCOMES)
    for agent in agents:
        found.update(agent.outcomes)
    return found


def label(outcome: str) -> str:
    """`partially_refunded` as people read it: "partially refunded"."""
    return outcome.replace("_", " ")
