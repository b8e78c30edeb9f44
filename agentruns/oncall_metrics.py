"""The /metrics families an on-call pages on (docs/alerts.yml, runbooks in docs/operations.md).

Beside the runtime's families (`health.py`): the inbox (pending and overdue items by agent, their
ages as a histogram: one query), the webhook outbox's backlog and oldest undelivered row (one
query), each worker's free run slots and runs ended by status as a counter (derived from the
runtime's families: no query), and what every process sees of the database and Redis, with its
model-provider errors by class (`runtime/process_health.py`: the web process's own view, live,
and each worker's from its heartbeat row: one query).

The process families need no database: with it down, /metrics still answers, saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    Q,
    Sum,
    Value,
)
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agentruns.conf import conf
from agentruns.models import RunStatus, WorkerHeartbeat
from agentruns.runtime import process_health, weather
from agentruns.runtime.ids import worker_name
from approvals.models import Approval, DeliveryStatus, WebhookDelivery

APPROVAL_AGE_BUCKETS = (60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
KINDS = ("approval", "reconciliation")


class Families(Collector):
    """Families computed beforehand (so a database error is caught before rendering starts)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


# ------------------------------------------------------------------ the inbox
def approval_families(now: Any) -> Iterator[Metric]:
    """Pending inbox items by agent and kind, in one query bucketed by the database."""
    buckets = {
        f"le_{i}": Count("id", filter=Q(created_at__gte=now - timedelta(seconds=bound)))
        for i, bound in enumerate(APPROVAL_AGE_BUCKETS)
    }
    waited = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - F("created_at"), output_field=DurationField()
    )
    rows = list(
        Approval.objects.filter(status="pending")
        .order_by()
        .values("agent", "kind")
        .annotate(
            n=Count("id"),
            overdue=Count("id", filter=Q(due_at__lt=now)),
            oldest=Min("created_at"),
            waited=Sum(waited),
            **buckets,
        )
    )
    oldest = min((row["oldest"] for row in rows), default=None)
    yield GaugeMetricFamily(
        "agentruns_oldest_pending_approval_age_seconds",
        "Age of the oldest pending approval or reconciliation (0 when none)",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )
    by_kind = GaugeMetricFamily(
        "agentruns_pending_approvals", "Pending inbox items by kind", labels=["kind"]
    )
    for kind in KINDS:
        by_kind.add_metric([kind], sum(row["n"] for row in rows if row["kind"] == kind))
    yield by_kind

    per_agent: dict[str, dict[str, Any]] = {}
    for row in rows:
        agent = per_agent.setdefault(
            row["agent"], {"n": 0, "overdue": 0, "waited": 0.0, "le": [0] * len(buckets)}
        )
        agent["n"] += row["n"]
        agent["overdue"] += row["overdue"]
        agent["waited"] += row["waited"].total_seconds() if row["waited"] else 0.0
        for i in range(len(buckets)):
            agent["le"][i] += row[f"le_{i}"]
    ages = GaugeHistogramMetricFamily(
        "agentruns_approval_age_seconds",
        "Ages of the pending approvals and reconciliations, by agent",
        labels=["agent"],
    )
    pending = GaugeMetricFamily(
        "agentruns_pending_approvals_by_agent", "Pending inbox items by agent", labels=["agent"]
    )
    overdue = GaugeMetricFamily(
        "agentruns_approvals_overdue",
        "Pending inbox items past their due time (AGENTRUNS_APPROVAL_ESCALATE_SECONDS)",
        labels=["agent"],
    )
    for name, agent in sorted(per_agent.items()):
        cumulative = [(str(float(b)), agent["le"][i]) for i, b in enumerate(APPROVAL_AGE_BUCKETS)]
        ages.add_metric([name], [*cumulative, ("+Inf", agent["n"])], gsum_value=agent["waited"])
        pending.add_metric([name], agent["n"])
        overdue.add_metric([name], agent["overdue"])
    yield from (ages, pending, overdue)


# ------------------------------------------------------------------ the outbox, derived families
def outbox_families(now: Any) -> Iterator[Metric]:
    backlog = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    yield GaugeMetricFamily(
        "agentruns_webhook_outbox_backlog",
        "Webhook deliveries not delivered yet (pending, retries included)",
        value=backlog["n"],
    )
    oldest = backlog["oldest"]
    yield GaugeMetricFamily(
        "agentruns_webhook_outbox_oldest_undelivered_age_seconds",
        "Age of the oldest undelivered webhook delivery (0 when none)",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )


def _samples(families: Iterable[Metric], name: str) -> dict[tuple, float]:
    for family in families:
        if family.name == name:
            return {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return {}


def derived_families(families: list[Metric]) -> list[Metric]:
    """From the runtime's families: runs ended as a counter, free slots per worker, the outbox."""
    ended = CounterMetricFamily(
        "agentruns_runs_ended", "Runs that ended, by final status", labels=["status"]
    )
    by_status = _samples(families, "agentruns_runs")
    for status in ENDED:
        ended.add_metric([status], by_status.get((("status", status),), 0.0))
    slots = GaugeMetricFamily(
        "agentruns_worker_pool_slots_free",
        "Runs the live worker process could still take (0 while it drains)",
        labels=["worker"],
    )
    capacity = _samples(families, "agentruns_worker_run_capacity")
    busy = _samples(families, "agentruns_worker_runs_in_flight")
    draining = _samples(families, "agentruns_worker_draining")
    for key, room in sorted(capacity.items()):
        free = 0.0 if draining.get(key) else max(room - busy.get(key, 0.0), 0.0)
        slots.add_metric([dict(key)["worker"]], free)
    return [ended, slots, *outbox_families(timezone.now())]


# ------------------------------------------------------------------ what each process sees
def _redis_reachable() -> bool | None:
    """None when there is no Redis to reach (the in-memory channel layer)."""
    if not conf.REDIS_URL:
        return None
    try:
        import redis

        client = redis.Redis.from_url(
            conf.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def process_families(database_up: bool) -> Iterator[Metric]:
    """This (web) process's view, and (database permitting) every worker's from its heartbeat:
    a worker whose heartbeat went stale is shown as not reaching the database."""
    redis_up = _redis_reachable()
    if redis_up is False:
        weather.redis.noticed(ConnectionError("no answer to PING"), "/metrics")
    elif redis_up:
        weather.redis.passed()
    labels = ["process", "role"]
    database = GaugeMetricFamily(
        "agentruns_process_database_up",
        "1 when the process reached the database at its last try (web: now; worker: by its "
        "heartbeat, which stops while it cannot)",
        labels=labels,
    )
    redis = GaugeMetricFamily(
        "agentruns_process_redis_up",
        "1 when the process reached Redis at its last try (absent: no Redis configured)",
        labels=labels,
    )
    db_errors = CounterMetricFamily(
        "agentruns_process_database_errors",
        "Failed database tries the process counted since it started",
        labels=labels,
    )
    model_errors = CounterMetricFamily(
        "agentruns_model_provider_errors",
        "Model-provider errors the process counted since it started, by class",
        labels=[*labels, "class"],
    )
    seen = [(f"web@{worker_name()}", "web", process_health.snapshot(), database_up)]
    if database_up:
        stale = timezone.now() - timedelta(seconds=conf.WORKER_STALE_SECONDS)
        for beat in WorkerHeartbeat.objects.filter(
            worker__startswith=WorkerHeartbeat.POOL_PREFIX
        ).order_by("worker"):
            name = beat.worker.removeprefix(WorkerHeartbeat.POOL_PREFIX)
            seen.append((name, "worker", beat.process_health or {}, beat.last_seen_at >= stale))
    for process, role, health, up in seen:
        database.add_metric([process, role], 1.0 if up else 0.0)
        redis_seen = (health.get("redis") or {}).get("up")
        if redis_seen is not None:
            redis.add_metric([process, role], 1.0 if redis_seen else 0.0)
        db_errors.add_metric(
            [process, role], float((health.get("database") or {}).get("errors", 0))
        )
        for label, n in sorted((health.get("model_errors") or {}).items()):
            model_errors.add_metric([process, role, label], float(n))
    yield from (database, redis, db_errors, model_errors)
