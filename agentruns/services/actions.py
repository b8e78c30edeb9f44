"""Actions on a run that exists: cancel, stop, retry, resolve a failed step by hand.

Each is atomic and audited on the run's timeline: its RunEvent is written in the same
transaction as the change, and the worker doorbell (`enqueue`) rings inside that transaction.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, RunStatus, Step, StepKind, StepStatus
from agentruns.runtime import writer
from agentruns.runtime.access import quotas
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.events import EventSpec, EventType, step_event_data
from agentruns.runtime.execution import transitions, unknown_outcomes
from agentruns.runtime.execution.cancel import cancel_run as _cancel_run
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.redaction import redact_fields, redact_text
from agentruns.runtime.values.timestamps import iso


def _lock(run_id: uuid.UUID | str) -> Run:
    return Run.objects.select_for_update().get(id=run_id)


def cancel_run(run_id: uuid.UUID | str, *, user: Any = None, reason: str = "") -> Run:
    """Cancel a queued, running or waiting run: now if nobody executes it, else at the next step
    boundary (`runtime/execution/cancel.py`)."""
    return _cancel_run(run_id, who=actor_name(user), reason=reason)


OPERATE = "agentruns.operate_run"


def may_stop(user: Any, run: Run) -> bool:
    """Its starter may stop their own run; an operator may stop any."""
    if user is None or not user.is_authenticated:
        return False
    return user.has_perm(OPERATE) or (
        run.created_by_id is not None and run.created_by_id == user.pk
    )


def stop_for(run_id: uuid.UUID | str, *, user: Any, reason: str = "") -> Run:
    """Stop a run as a person asked (the API, the chat's stop button, the run page): counted
    against their stops first (a refused one too, `quotas.check_stop`), then only its starter
    or an operator may (`may_stop`, else PermissionDenied)."""
    quotas.check_stop(user)
    run = Run.objects.only("id", "created_by_id").get(id=run_id)
    if not may_stop(user, run):
        raise PermissionDenied("permission denied: only its starter or an operator may stop a run")
    return stop_run(run.id, user=user, reason=reason)


def stop_run(run_id: uuid.UUID | str, *, user: Any = None, reason: str = "") -> Run:
    """Stop a run: its model turn in flight ends within a second, keeping its text so far as the
    run's output, a tool call in flight finishes first (exactly once), and the run ends
    `cancelled` with the stop reason "stopped"; a waiting or queued run ends now. Stopping a run
    already asked to stop asks again (no error). Who may: `may_stop` (the caller checks it; a
    thread's `interrupt` stops its active run as the system)."""
    return _cancel_run(run_id, who=actor_name(user), reason=reason, stop=True)


def _retryable_failed_step(run: Run) -> Step | None:
    """The step the run failed on: the newest failed step that actually ran (a failed step with
    no attempt is bad model output that was already fed back to the model)."""
    return (
        Step.objects.filter(run=run, status=StepStatus.FAILED)
        .filter(Q(kind=StepKind.MODEL) | Q(attempts__gt=0))
        .order_by("-index")
        .first()
    )


def retry_run(run_id: uuid.UUID | str, *, user: Any = None) -> Run:
    """Retry a failed run from its failed step: same step row, a new attempt, same idempotency key.

    Completed steps are never executed again: the engine skips terminal steps and rebuilds the
    conversation from their stored results. Nor is a step whose outcome is unknown (an abort in
    the inbox left it so): the retry is refused, saying what to do instead, or the step is
    skipped, as the run's policy says (`runtime/execution/unknown_outcomes.py`). A run stopped by
    a limit (max steps, token budget, deadline) gets that limit extended once more, so the retry
    has room to finish; the extension is recorded on the timeline.
    """
    with transaction.atomic():
        run = _lock(run_id)
        if run.status != RunStatus.FAILED:
            raise ActionRefused(f"only failed runs can be retried (this one is {run.status})")
        unsettled = unknown_outcomes.check_retry(run)
        who = actor_name(user)
        now = timezone.now()
        events: list[EventSpec] = []
        if unsettled:
            events += unknown_outcomes.skip_for_retry(run, unsettled, who=who or "staff", now=now)
            Run.objects.filter(id=run.id).update(permissions=run.permissions)
        failed = _retryable_failed_step(run)
        if failed is not None:
            failed.status, failed.finished_at, failed.next_attempt_at = (
                StepStatus.PENDING,
                None,
                None,
            )
            failed.retry_base = failed.attempts  # a fresh automatic-retry budget from here
            writer.save_step(failed, ["status", "finished_at", "next_attempt_at", "retry_base"])
            events.append(
                (
                    EventType.STEP_RETRY_REQUESTED,
                    step_event_data(
                        failed,
                        next_attempt=failed.attempts + 1,
                        idempotency_key=failed.idempotency_key,
                        by=who,
                        # a request to try again has no error of its own: the one it answers
                        # is the previous attempt's
                        error="",
                        previous_error=redact_text(failed.error),
                    ),
                )
            )
        extended, limits = _extended_limits(run, now)
        events.append(
            (
                EventType.RUN_RETRIED,
                {
                    "by": who,
                    "step": failed.index if failed else None,
                    "extended": extended,
                    "skipped": [step.index for step in unsettled],
                },
            )
        )
        change = transitions.requeued(now).after(*events)
        change.fields.update(limits)
        transitions.apply(run.id, change)
        change.apply_to(run)
        enqueue(run.id)
    return run


def _extended_limits(run: Run, now: Any) -> tuple[dict, dict[str, Any]]:
    """The room a run that a stop condition ended needs to continue: (for the timeline, fields)."""
    if run.stop_reason == "max_steps":
        max_steps = run.max_steps + conf.DEFAULT_MAX_STEPS
        return {"max_steps": max_steps}, {"max_steps": max_steps}
    if run.stop_reason == "token_budget" and run.token_budget:
        budget = run.total_tokens + run.token_budget
        return {"token_budget": budget}, {"token_budget": budget}
    if run.stop_reason == "deadline" and run.deadline_at and run.started_at:
        deadline = now + max(run.deadline_at - run.started_at, timedelta(seconds=1))
        return {"deadline_at": iso(deadline)}, {"deadline_at": deadline}
    return {}, {}


def resolve_step(step_id: uuid.UUID | str, result: Any, *, user: Any = None) -> Step:
    """Mark a failed side-effect step done with an operator-supplied result; the run continues.

    For when staff fixed things by hand (refunded in the gateway's console, for example): the
    step becomes succeeded with that result, which the model sees as the tool's answer, and the
    failed run is queued again. The step's attempts keep their real outcomes.
    """
    with transaction.atomic():
        step = Step.objects.select_for_update().get(id=step_id)
        run = _lock(step.run_id)
        # an unknown outcome resolved with its result: a person says the call happened
        resolvable = (StepStatus.FAILED, StepStatus.UNKNOWN)
        if step.kind != StepKind.TOOL or step.status not in resolvable:
            raise ActionRefused(
                "only a failed tool step, or one whose outcome is unknown, can be resolved "
                f"(step #{step.index} is {step.status})"
            )
        if not run.tool_policy(step.tool).get("side_effect"):
            raise ActionRefused(
                f"{step.tool} has no side effect: retry the run instead of supplying a result"
            )
        if step.attempts == 0:
            raise ActionRefused("this call never ran (bad arguments); the model was already told")
        if run.status != RunStatus.FAILED:
            raise ActionRefused(
                f"the run is {run.status}; only steps of failed runs can be resolved"
            )
        if not isinstance(result, dict):
            raise ActionRefused("the result must be a JSON object")
        others = [s for s in unknown_outcomes.unsettled_steps(run) if s.id != step.id]
        if others:  # the run would continue into a call nobody settled
            raise ActionRefused(unknown_outcomes.refusal(run, others[0], "resolving"))
        now = timezone.now()
        who = actor_name(user)
        previous_error = step.error
        step.status, step.result, step.finished_at = StepStatus.SUCCEEDED, result, now
        step.next_attempt_at = None
        step.error = f"resolved by {who or 'operator'} (was: {previous_error})"[:2000]
        writer.save_step(step)
        operations.resolved_by_hand(run, step, result)
        resolved = step_event_data(
            step,
            by=who,
            result=redact_fields(result, run.redacted_fields(step.tool)),
            was=previous_error,
        )
        transitions.apply(
            run.id, transitions.requeued(now).after((EventType.STEP_RESOLVED, resolved))
        )
        enqueue(run.id)
    return step
