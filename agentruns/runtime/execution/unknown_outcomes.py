"""Calls whose outcome is unknown (DESIGN.md 4.5): the one rule every door obeys.

A side-effect call that may or may not have taken effect (its worker died mid-call, or its
connection broke after the call was sent, for a tool with `idempotency="none"`) leaves its step
`unknown`. **Such a step is never executed again unless a person says the call did not happen.**
The step's status is the record: it stays `unknown` until a person's word moves it, and only
these words do:

- "it happened" (the reconciliation's answer, `happened`; or resolving the failed run's step with
  the call's result, `services.resolve_step`): succeeded, with that result;
- "it did not happen" (the reconciliation's "retry", `did_not_happen`): pending, run again with
  the same idempotency key;
- "abort" (the reconciliation, `abandoned`): the run fails and the step stays `unknown` for good.

Every other door works around it, here:

- retry of the failed run (`check_retry` / `skip_for_retry`): refused with what to do instead, or,
  when the run's policy says "skip" (`Agent(retry_unknown="skip")`, frozen on the run), the step
  ends `skipped`: the model is told its outcome is unknown and that it was not made again, and its
  tool needs a person's approval for the rest of the run, so asking again is a person's decision;
- fork: copied steps are history and never run; a turn asked again may call the tool again, so
  the fork's permission snapshot puts the tool under approval (`services/forks.py`), which the
  forking person cannot opt out of for a tool whose outcome is unknown (`must_ask_again`);
- approving (the inbox, bulk, the chat): a reconciliation is not an approval (approvals'
  `check_open`);
- the executor never executes an `unknown` step: its unit parks the run (engine/tools/unit.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from agentruns.models import Run, Step, StepKind, StepStatus
from agentruns.runtime import writer
from agentruns.runtime.access.permissions import require_approval
from agentruns.runtime.events import EventSpec, EventType, step_event_data
from agentruns.runtime.execution.transitions import ActionRefused

REFUSE, SKIP = "refuse", "skip"


def is_unsettled(step: Step) -> bool:
    """The step's call may have taken effect and no person has said whether it did."""
    return step.status == StepStatus.UNKNOWN


def must_ask_again(step: Step) -> bool:
    """Whether a new call of this step's tool must go to a person (in a fork), whatever else was
    chosen: its call here may have happened and nobody said it did not (it is unknown, or it was
    skipped after an attempt: a retry skipped its unknown outcome)."""
    if step.kind != StepKind.TOOL:
        return False
    return is_unsettled(step) or (step.status == StepStatus.SKIPPED and step.attempts > 0)


# ------------------------------------------------------------------ a person's word
def happened(step: Step, result: Any, *, who: str, now: datetime) -> None:
    """A person says the call happened: the step succeeds with `result` (or a marker)."""
    step.status, step.finished_at = StepStatus.SUCCEEDED, now
    step.result = (
        result if result is not None else {"reconciled": True, "happened": True, "by": who}
    )
    step.error = f"outcome unknown; {who} confirmed it happened"


def did_not_happen(step: Step, *, who: str) -> None:
    """A person says the call did not happen: the step runs again, with the same key."""
    step.status, step.finished_at = StepStatus.PENDING, None
    step.error = f"outcome unknown; {who} confirmed it did not happen, retrying"


def abandoned(step: Step, *, who: str, now: datetime) -> None:
    """A person aborts the run: the step stays unknown, never executed again by any door."""
    step.status, step.finished_at = StepStatus.UNKNOWN, now
    step.error = f"aborted by {who}: outcome unknown, never run again"


# ------------------------------------------------------------------ retry of the failed run
def unsettled_steps(run: Run) -> list[Step]:
    return list(Step.objects.filter(run=run, status=StepStatus.UNKNOWN).order_by("index"))


def refusal(run: Run, step: Step, doing: str = "retry") -> str:
    """What a door that would run `step` again says instead, and what to do."""
    asked_by = (
        Step.objects.filter(run=run, kind=StepKind.MODEL, index__lt=step.index)
        .order_by("-index")
        .values_list("index", flat=True)
        .first()
    )
    fork = (
        f", or fork from step #{asked_by} to let the model decide again (its repeated side "
        "effects wait for approval)"
        if asked_by is not None
        else ""
    )
    return (
        f"{doing} refused: step #{step.index} {step.tool} has an unknown outcome (the call may "
        "have taken effect and nobody said it did not), so it is never run again. If it "
        f"happened, resolve step #{step.index} with the call's result{fork}."
    )


def check_retry(run: Run) -> list[Step]:
    """Before a retry of the failed `run` (locked by the caller): its unsettled steps, which the
    retry skips; ActionRefused, with the reason, when the run's policy is to refuse."""
    unsettled = unsettled_steps(run)
    if unsettled and run.retry_unknown != SKIP:
        raise ActionRefused(refusal(run, unsettled[0]))
    return unsettled


def skip_for_retry(
    run: Run, unsettled: Iterable[Step], *, who: str, now: datetime
) -> list[EventSpec]:
    """The run's policy is "skip": each unsettled step ends skipped, the model is told so, and
    its tool needs approval for the rest of the run. Returns the events; the caller writes the
    run's new permission snapshot (`run.permissions`) with them."""
    events: list[EventSpec] = []
    tools: dict[str, str] = {}
    for step in unsettled:
        step.status, step.finished_at = StepStatus.SKIPPED, now
        step.error = (
            f"outcome unknown: this call may or may not have happened, and it was not made again "
            f"(skipped on retry by {who}, as the run's policy says)"
        )
        writer.save_step(step, ["status", "finished_at", "error"])
        events.append((EventType.STEP_SKIPPED, step_event_data(step, by=who)))
        tools.setdefault(step.tool, f"step #{step.index} had an unknown outcome and was skipped")
    run.permissions = require_approval(run.permissions, run.tool_snapshot, tools)
    return events
