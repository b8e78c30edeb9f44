"""The /metrics families an on-call pages on (docs/alerts.yml, runbooks in docs/operations.md).

Beside the runtime's families (`health.py`): the inbox's, asked through its port
(runtime/inbox.py: pending and overdue items by agent, their ages as a histogram: one query; the
webhook outbox's backlog and oldest undelivered row: one query), each worker's free run slots and runs ended by status as a counter (derived from the
runtime's families: no query), and what every process sees of the database and Redis, with its
model-provider errors by class (`runtime/outages/process_health.py`: the web process's own view, live,
and each worker's from its heartbeat row: one query).

The process families need no database: with it down, /metrics still answers, saying so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta

from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agentruns.conf import conf
from agentruns.models import RunStatus, WorkerHeartbeat
from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages import process_health, weather
from agentruns.runtime.values.ids import worker_name

ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class Families(Collector):
    """Families computed beforehand (so a database error is caught before rendering starts)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


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
    return [ended, slots, *inbox().delivery_families(timezone.now())]


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
