"""Reads: kept here so views and the consumer share one definition of each query."""

from __future__ import annotations

import uuid

from .models import Run, RunEvent, Step


def get_run(run_id: uuid.UUID | str) -> Run | None:
    return Run.objects.filter(id=run_id).first()


def run_steps(run: Run) -> list[Step]:
    return list(Step.objects.filter(run=run).order_by("index"))


def events_after(run_id: uuid.UUID | str, after: int, limit: int = 1000) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit])


def nav_counts() -> dict:
    from django.db.models import Count

    from approvals.models import Approval

    runs = dict(
        Run.objects.filter(status__in=["failed", "waiting", "running", "queued"])
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    pending = Approval.objects.filter(status="pending").count()
    return {"runs": runs, "pending_approvals": pending}
