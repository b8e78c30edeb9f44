"""What a waiting run waits for (`waiting_for`): `{"kind", "since", "due", "token"}`.

Derived in the one query that reads the runs: each run's latest pending `Wait` (its kind:
approval, question, event, timer, message; since it was made; when it is due; the token a hook
resolves, for an event) and, for a run parked on a step a person must settle without a wait
row (an unknown outcome's reconciliation), that step (kind `approval`). Runs not `waiting` wait
for nothing (None).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from agentruns.models import Run, RunStatus, Step, StepStatus, Wait, WaitKind, WaitStatus
from agentruns.runtime.values.timestamps import iso

KINDS = tuple(WaitKind.values)
_HELD = (StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN)


def _pending() -> QuerySet[Wait]:
    return Wait.objects.filter(run=OuterRef("pk"), status=WaitStatus.PENDING).order_by("-ordinal")


def _held() -> QuerySet[Step]:
    return Step.objects.filter(run=OuterRef("pk"), status__in=_HELD).order_by("index")


def _held_since() -> Subquery:
    return Subquery(_held().values(since=Coalesce("finished_at", "started_at", "created_at"))[:1])


def with_waiting_for(runs: QuerySet[Run]) -> QuerySet[Run]:
    """`runs` with what each waits for, as `waiting_for(run)` reads it (same query)."""
    pending = _pending()
    return runs.annotate(
        wait_kind=Subquery(pending.values("kind")[:1]),
        wait_since=Subquery(pending.values("created_at")[:1]),
        wait_due=Subquery(pending.values("due_at")[:1]),
        wait_token=Subquery(pending.values("token")[:1]),
        held_since=_held_since(),
    )


def waiting_for(run: Run) -> dict[str, Any] | None:
    """What `run` (annotated by `with_waiting_for`, or read here in one query) waits for."""
    if run.status != RunStatus.WAITING:
        return None
    if not hasattr(run, "wait_kind"):
        run = with_waiting_for(Run.objects.filter(id=run.id)).only("id", "status").first() or run
    kind = getattr(run, "wait_kind", None)
    if kind is None and getattr(run, "held_since", None) is None:
        return None
    if kind is None:
        return {
            "kind": WaitKind.APPROVAL.value,
            "since": iso(run.held_since),
            "due": None,
            "token": None,
        }
    return {
        "kind": kind,
        "since": iso(run.wait_since),
        "due": iso(run.wait_due),
        "token": run.wait_token if kind == WaitKind.EVENT else None,  # what a hook is sent to
    }


def waiting_on(kind: str) -> Q:
    """Runs waiting for `kind` (the runs list's filter)."""
    waits = Wait.objects.filter(run=OuterRef("pk"), status=WaitStatus.PENDING, kind=kind)
    condition = Exists(waits)
    if kind == WaitKind.APPROVAL:
        condition = condition | Exists(_held())
    return Q(status=RunStatus.WAITING) & condition


def waiting_by_kind() -> dict[str, tuple[int, datetime | None]]:
    """/metrics: waiting runs by what they wait for, and the oldest wait of each kind, in one
    query: the pending waits of waiting runs (the partial index holds only pending ones), and
    the runs held on a step a person settles with no wait row (a reconciliation), counted as
    approvals as `waiting_for` says."""
    waits = (
        Wait.objects.filter(status=WaitStatus.PENDING, run__status=RunStatus.WAITING)
        .order_by()
        .values_list("kind")
        .annotate(n=Count("run_id", distinct=True), oldest=Min("created_at"))
    )
    held = (
        Run.objects.filter(status=RunStatus.WAITING)
        .exclude(Exists(_pending()))
        .annotate(held_since=_held_since(), kind=Value(WaitKind.APPROVAL.value))
        .filter(held_since__isnull=False)
        .order_by()
        .values_list("kind")
        .annotate(n=Count("id"), oldest=Min("held_since"))
    )
    counts: dict[str, tuple[int, datetime | None]] = {}
    for kind, n, oldest in waits.union(held, all=True):
        before, earlier = counts.get(kind, (0, None))
        times = [t for t in (earlier, oldest) if t is not None]
        counts[kind] = (before + n, min(times) if times else None)
    return counts
