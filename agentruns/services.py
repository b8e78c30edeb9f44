"""User actions on runs: one `do_*`-style function each, atomic, audited on the run's timeline.

Each writes its RunEvent in the same transaction as the change and rings the worker doorbell
(`enqueue`) inside that transaction: with the ORM broker a rolled-back change leaves no task.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .events import append_events
from .models import AttemptOutcome, Run, RunStatus, Step, StepAttempt, StepKind, StepStatus
from .registry import get_agent


class ActionRefused(Exception):
    """The action does not apply to the run in its current state (a 409 for the API)."""


def enqueue(run_id: uuid.UUID | str) -> None:
    from django_q.tasks import async_task

    async_task("agentruns.tasks.advance_run", str(run_id), task_name=f"run-{run_id}"[:100])


def actor_name(user: Any) -> str | None:
    return getattr(user, "username", None) if user is not None else None


@dataclass
class StartResult:
    run: Run
    created: bool


def start_run(
    agent_name: str,
    run_input: dict,
    *,
    dedupe_key: str | None = None,
    user: Any = None,
    model: str | None = None,
) -> StartResult:
    """Create and enqueue a run; a repeated (agent, dedupe_key) returns the existing run.

    The unique constraint decides between concurrent starts, not a pre-check.
    """
    agent = get_agent(agent_name)
    if not isinstance(run_input, dict):
        raise ValueError("input must be a JSON object")
    if agent.input_schema is not None:
        import jsonschema

        try:
            jsonschema.validate(run_input, agent.input_schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "input"
            raise ValueError(f"{where}: {exc.message}") from None
    if dedupe_key is not None:
        existing = Run.objects.filter(agent=agent_name, dedupe_key=dedupe_key).first()
        if existing is not None:
            return StartResult(existing, False)
    now = timezone.now()
    run = Run(
        agent=agent_name,
        input=run_input,
        dedupe_key=dedupe_key,
        model=model or agent.model or settings.AGENTRUNS_MODEL,
        tool_snapshot={t.name: t.policy() for t in agent.tool_objects()},
        max_steps=agent.max_steps or settings.AGENTRUNS_DEFAULT_MAX_STEPS,
        token_budget=agent.token_budget,
        deadline_at=now + timedelta(seconds=agent.deadline_seconds) if agent.deadline_seconds else None,
        search_text=" ".join(str(run_input.get(f, "")) for f in agent.search_fields).strip()[:200],
        created_by=user if getattr(user, "is_authenticated", False) else None,
        enqueued_at=now,
    )
    try:
        with transaction.atomic():
            run.save(force_insert=True)
            append_events(
                run.id,
                [("run.created", {"agent": agent_name, "by": actor_name(user), "status": "queued"})],
            )
            enqueue(run.id)
    except IntegrityError:
        if dedupe_key is None:
            raise
        return StartResult(Run.objects.get(agent=agent_name, dedupe_key=dedupe_key), False)
    return StartResult(run, True)


def _lock(run_id: uuid.UUID | str) -> Run:
    return Run.objects.select_for_update().get(id=run_id)


def cancel_run(run_id: uuid.UUID | str, *, user: Any = None, reason: str = "") -> Run:
    """Cancel a queued, running or waiting run.

    A run nobody executes (waiting, or queued with no live lease) is cancelled now and its
    parked approvals are withdrawn; a running one is flagged and the engine stops at the next
    step boundary.
    """
    from approvals.services import withdraw_approvals

    with transaction.atomic():
        run = _lock(run_id)
        if run.is_terminal:
            raise ActionRefused(f"run is already {run.status}")
        now = timezone.now()
        lease_live = run.lease_expires_at is not None and run.lease_expires_at > now
        who = actor_name(user)
        if run.status == RunStatus.WAITING or not lease_live:
            withdrawn = withdraw_approvals(run, reason=f"run cancelled by {who or 'system'}")
            Step.objects.filter(run=run, status__in=[StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN, StepStatus.PENDING]).update(status=StepStatus.SKIPPED, finished_at=now)
            run.status, run.stop_reason, run.finished_at = RunStatus.CANCELLED, "cancelled", now
            run.error = reason or f"cancelled by {who or 'system'}"
            run.lease_owner, run.lease_expires_at, run.cancel_requested = "", None, False
            run.save()
            append_events(
                run.id,
                [
                    ("run.cancel_requested", {"by": who, "reason": reason}),
                    *[("approval.withdrawn", {"approval": a}) for a in withdrawn],
                    ("run.status", {"status": RunStatus.CANCELLED, "stop_reason": "cancelled"}),
                ],
            )
        else:
            run.cancel_requested = True
            run.save(update_fields=["cancel_requested", "updated_at"])
            append_events(run.id, [("run.cancel_requested", {"by": who, "reason": reason})])
    return run


def retry_run(run_id: uuid.UUID | str, *, user: Any = None) -> Run:
    """Retry a failed run from its failed step: same step, new attempt, same idempotency key.

    Completed steps are never executed again. A run that failed on a stop condition or a model
    error without a failed tool step is re-queued to continue from where it stopped.
    """
    with transaction.atomic():
        run = _lock(run_id)
        if run.status != RunStatus.FAILED:
            raise ActionRefused(f"only failed runs can be retried (this one is {run.status})")
        failed = (
            Step.objects.filter(run=run, status=StepStatus.FAILED)
            .order_by("-index")
            .first()
        )
        events: list[tuple[str, dict]] = []
        if failed is not None and (failed.kind == StepKind.MODEL or failed.attempts > 0):
            failed.status, failed.finished_at, failed.next_attempt_at = StepStatus.PENDING, None, None
            failed.save(update_fields=["status", "finished_at", "next_attempt_at"])
            events.append(("step.retry_requested", {"step": failed.index, "by": actor_name(user)}))
        if run.stop_reason == "max_steps":
            run.max_steps += settings.AGENTRUNS_DEFAULT_MAX_STEPS
        run.status, run.error, run.stop_reason, run.finished_at = RunStatus.QUEUED, "", "", None
        run.enqueued_at = timezone.now()
        run.save()
        events.append(("run.retried", {"by": actor_name(user)}))
        events.append(("run.status", {"status": RunStatus.QUEUED}))
        append_events(run.id, events)
        enqueue(run.id)
    return run


def resolve_step(step_id: uuid.UUID | str, result: Any, *, user: Any = None) -> Step:
    """Mark a failed side-effect step done with an operator-supplied result; the run continues."""
    with transaction.atomic():
        step = Step.objects.select_related("run").select_for_update().get(id=step_id)
        run = step.run
        if step.status != StepStatus.FAILED or step.kind != StepKind.TOOL:
            raise ActionRefused(f"only a failed tool step can be resolved (this one is {step.status})")
        if run.status not in (RunStatus.FAILED, RunStatus.WAITING):
            raise ActionRefused(f"the run is {run.status}; resolve steps of failed runs")
        now = timezone.now()
        who = actor_name(user)
        step.status, step.result, step.finished_at = StepStatus.SUCCEEDED, result, now
        step.error = f"resolved by {who or 'operator'} (was: {step.error})"[:2000]
        step.save()
        StepAttempt.objects.filter(step=step, finished_at__isnull=True).update(
            finished_at=now, outcome=AttemptOutcome.SUCCEEDED
        )
        run.status, run.error, run.stop_reason, run.finished_at = RunStatus.QUEUED, "", "", None
        run.enqueued_at = now
        run.save()
        append_events(
            run.id,
            [
                ("step.resolved", {"step": step.index, "by": who, "result": result}),
                ("run.status", {"status": RunStatus.QUEUED}),
            ],
        )
        enqueue(run.id)
    return step
