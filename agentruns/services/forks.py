"""What a fork would do again: the side effects its source made at and after the cut.

A fork copies the source's steps before the cut as history (never executed) and asks the model
turn at the cut afresh. The model may then ask again for any call the source made from there on,
and such a call is a new step with a new idempotency key: a mail goes out twice, a note is added
twice, a refund keyed by its step is made twice. So the fork's confirmation (the page, the API's
`GET /api/runs/<id>/fork?from_step=N` and the fork's own answer) lists those calls, and by
default the fork puts each of their tools under approval in its frozen permission snapshot
(`permissions.require_approval`): the executor's own approval path then parks such a call in the
inbox, where a person decides whether to repeat it. The forking person may opt out
(`approve_repeats=False`): the tools then run as their own rules say, except a tool whose call
in the source has an unknown outcome, which stays under approval (the one rule of
`runtime/execution/unknown_outcomes.py`).

The rule is by tool, for the whole fork: a model asked again rarely repeats a call byte for byte
(a real model rewrites the mail), so matching calls by their arguments would let the second mail
through, and any later call of such a tool may repeat what the source already did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentruns.models import Run, Step, StepKind, StepStatus
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.runtime.execution.unknown_outcomes import must_ask_again

# a call was made (its effect may stand) when it has an attempt or a result that stands
_MADE = (StepStatus.SUCCEEDED, StepStatus.UNKNOWN, StepStatus.RUNNING)


@dataclass(frozen=True)
class Repeat:
    """A side-effect call of the source at or after the cut that the fork may make again."""

    index: int
    tool: str
    status: str
    idempotency: str  # "key", "none" or "transaction" (rows of this database)
    outcome_unknown: bool  # the call may or may not have happened in the source
    approval: bool  # in the fork, a person approves a call of this tool first

    def payload(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tool": self.tool,
            "status": self.status,
            "idempotency": self.idempotency,
            "outcome_unknown": self.outcome_unknown,
            "approval": self.approval,
        }

    @property
    def why(self) -> str:
        made = "may have made" if self.outcome_unknown else "made"
        return f"the fork's source run {made} this call at or after the cut (step #{self.index})"


@dataclass(frozen=True)
class ForkPlan:
    source: Run
    from_step: int
    history: list[Step]  # copied as history, never executed
    repeats: list[Repeat]
    approve_repeats: bool

    @property
    def approval_for(self) -> dict[str, str]:
        """tool -> why the fork puts it under approval (the first repeat of it says)."""
        marked: dict[str, str] = {}
        for repeat in self.repeats:
            if repeat.approval:
                marked.setdefault(repeat.tool, repeat.why)
        return marked

    def payload(self) -> dict[str, Any]:
        return {
            "run_id": str(self.source.id),
            "from_step": self.from_step,
            "approve_repeats": self.approve_repeats,
            "repeats": [repeat.payload() for repeat in self.repeats],
            "approval_for": sorted(self.approval_for),
        }


def plan(source: Run, from_step: int, *, approve_repeats: bool = True) -> ForkPlan:
    """The fork of `source` at model step `from_step` (ActionRefused for a cut that cannot be
    forked): what it copies and which of the source's side effects it may repeat."""
    steps = list(Step.objects.filter(run=source).order_by("index"))
    cut = next((s for s in steps if s.index == from_step), None)
    if cut is None or cut.kind != StepKind.MODEL:
        raise ActionRefused(
            "fork from a model step: the history must end with every tool call answered"
        )
    history = [s for s in steps if s.index < from_step]
    unfinished = [s.index for s in history if not s.is_terminal]
    if unfinished:
        raise ActionRefused(f"steps {unfinished} before #{from_step} have not finished")
    repeats = []
    for step in steps[len(history) :]:
        policy = source.tool_policy(step.tool) if step.kind == StepKind.TOOL else {}
        if not policy.get("side_effect") or not (step.status in _MADE or step.attempts):
            continue
        unknown = must_ask_again(step)
        repeats.append(
            Repeat(
                index=step.index,
                tool=step.tool,
                status=step.status,
                idempotency="transaction"
                if policy.get("transactional")
                else str(policy.get("idempotency", "key")),
                outcome_unknown=unknown,
                approval=approve_repeats or unknown,
            )
        )
    return ForkPlan(source, from_step, history, repeats, approve_repeats)
