"""/healthz (JSON, 503 when unhealthy) and /metrics (Prometheus text via prometheus-client).

/metrics is built to be scraped every few seconds by several Prometheus replicas against a big
table: each family is one aggregate query that returns a handful of numbers (no rows are pulled
into Python), the step-duration histogram aggregates a bounded window of the newest attempts in
SQL (a primary-key range, not a scan), and the whole body is cached for a few seconds per process
(AGENTRUNS_METRICS_CACHE_SECONDS), so N scrapes within that time cost one computation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

from django.core.cache import cache
from django.db import DatabaseError, connection
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
)
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from agentruns.conf import conf
from agentruns.models import Run, RunStatus, Step, StepAttempt, WorkerHeartbeat
from agentruns.oncall_metrics import (
    Families,
    derived_families,
    process_families,
)
from agentruns.operators import details_for_operators, operators_only
from agentruns.runtime.inbox import inbox
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.waiting import KINDS as WAIT_KINDS
from agentruns.selectors.waiting import waiting_by_kind

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
METRICS_CACHE_KEY = "agentruns:metrics:v1"


@details_for_operators  # anyone else: {"status": ...} with the same code
def healthz(request: HttpRequest) -> JsonResponse:
    """Healthy = the database answers, a worker heartbeat is fresh, the sweeper ran recently.

    The worker and sweeper checks read WorkerHeartbeat rows, written by the sweeper loop in every
    `qcluster` (and by the q2 schedule as a backstop). A web process alone is not a working system:
    runs would queue forever, so that is reported as unhealthy (503) too.
    """
    checks: dict[str, dict] = {}
    if conf.REDIS_URL:
        checks["redis"] = redis_check(conf.REDIS_URL)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = {"ok": True}
    except Exception as exc:  # any driver error means "not reachable" to a load balancer
        checks["database"] = {"ok": False, "error": type(exc).__name__}
        failed = [name for name, check in checks.items() if not check["ok"]]
        response = JsonResponse(
            {"status": "unhealthy", "failed": failed, "checks": checks}, status=503
        )
        response["Retry-After"] = "5"
        return response
    now = timezone.now()
    stale_after = conf.WORKER_STALE_SECONDS
    threshold = now - timedelta(seconds=stale_after)
    beat = WorkerHeartbeat.objects.aggregate(
        seen=Max("last_seen_at"),
        swept=Max("last_sweep_at"),
        live=Count("id", filter=Q(last_seen_at__gte=threshold)),
    )
    seen, swept = beat["seen"], beat["swept"]
    pools = live_pools(threshold)
    checks["worker"] = {
        "ok": bool(seen and seen >= threshold),
        "last_seen_at": iso(seen),
        "age_seconds": round((now - seen).total_seconds(), 3) if seen else None,
        "live_workers": beat["live"],
        "stale_after_seconds": stale_after,
        # the run pools of the live worker processes (runtime/workers/pool.py)
        "runs_in_flight": sum(p.runs_in_flight for p in pools),
        "run_capacity": sum(p.run_capacity for p in pools if not p.draining),
        "processes": [
            {
                "worker": p.worker.removeprefix(WorkerHeartbeat.POOL_PREFIX),
                "runs_in_flight": p.runs_in_flight,
                "run_capacity": p.run_capacity,
                "draining": p.draining,
                "db_connections": p.db_connections,
                "last_seen_at": iso(p.last_seen_at),
            }
            for p in pools
        ],
    }
    checks["sweeper"] = {
        "ok": bool(swept and swept >= threshold),
        "last_sweep_at": iso(swept),
        "age_seconds": round((now - swept).total_seconds(), 3) if swept else None,
        "stale_after_seconds": stale_after,
    }
    failed = [name for name, check in checks.items() if not check["ok"]]
    return JsonResponse(
        {
            "status": "unhealthy" if failed else "ok",
            "failed": failed,
            "checks": checks,
            "time": now.isoformat(),
        },
        status=503 if failed else 200,
    )


def redis_check(url: str) -> dict:
    """The channel layer's Redis answers a PING within a second (the stream falls back to the
    database poll without it, but an operator wants to know)."""
    import redis  # only with REDIS_URL set

    try:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return {"ok": True}
    except Exception as exc:  # refused, timed out, bad auth: not usable either way
        return {"ok": False, "error": type(exc).__name__}


def live_pools(threshold) -> list[WorkerHeartbeat]:
    """The run pools of worker processes whose heartbeat is fresher than `threshold`."""
    return list(
        WorkerHeartbeat.objects.filter(
            worker__startswith=WorkerHeartbeat.POOL_PREFIX, last_seen_at__gte=threshold
        ).order_by("worker")
    )


def pool_families(now) -> Iterator[GaugeMetricFamily]:
    """Runs in flight and capacity per live worker process, and their totals."""
    pools = live_pools(now - timedelta(seconds=conf.WORKER_STALE_SECONDS))
    per_process = {
        "agentruns_worker_runs_in_flight": ("Runs executing in the process", "runs_in_flight"),
        "agentruns_worker_run_capacity": (
            "Runs the process may execute at once (AGENTRUNS_RUNS_PER_PROCESS)",
            "run_capacity",
        ),
        "agentruns_worker_db_connections": ("Open connections of its pool", "db_connections"),
        "agentruns_worker_draining": ("1 while the process drains before it stops", "draining"),
    }
    for name, (doc, attr) in per_process.items():
        family = GaugeMetricFamily(name, doc, labels=["worker"])
        for p in pools:
            family.add_metric(
                [p.worker.removeprefix(WorkerHeartbeat.POOL_PREFIX)], float(getattr(p, attr))
            )
        yield family
    yield GaugeMetricFamily(
        "agentruns_runs_in_flight",
        "Runs executing in all live worker processes",
        value=sum(p.runs_in_flight for p in pools),
    )
    yield GaugeMetricFamily(
        "agentruns_run_capacity",
        "Runs all live worker processes (not draining) may execute at once",
        value=sum(p.run_capacity for p in pools if not p.draining),
    )


class RuntimeCollector(Collector):
    """Collects the runtime's families from the database at scrape time."""

    def __init__(self, window: int) -> None:
        self.window = window

    def collect(self) -> Iterator:
        now = timezone.now()
        started = time.perf_counter()

        runs = GaugeMetricFamily("agentruns_runs", "Runs by status", labels=["status"])
        by_status: dict[str, int] = {}
        prompt_tokens = completion_tokens = 0
        cost_usd = 0.0
        # one pass over the runs for the status counts, the token totals and the cost
        for status, n, prompt, completion, cost in (
            Run.objects.order_by()
            .values_list("status")
            .annotate(
                n=Count("*"), p=Sum("prompt_tokens"), c=Sum("completion_tokens"), u=Sum("cost_usd")
            )
        ):
            by_status[status] = n
            prompt_tokens += prompt or 0
            completion_tokens += completion or 0
            cost_usd += float(cost or 0)
        for status in RunStatus.values:
            runs.add_metric([status], by_status.get(status, 0))
        yield runs

        # a run waiting for a retry backoff is queued with its doorbell due later (enqueued_at);
        # one queued behind another run of its concurrency key: no worker may claim it yet
        queued = Run.objects.filter(status=RunStatus.QUEUED).aggregate(
            backing_off=Count("id", filter=Q(enqueued_at__gt=now)),
            in_line=Count("id", filter=Q(waiting_behind__isnull=False)),
        )
        backing_off, in_line = queued["backing_off"], queued["in_line"]
        yield GaugeMetricFamily(
            "agentruns_queue_depth",
            "Runs queued and waiting for a worker to claim them (backoffs not yet due and runs "
            "waiting in a concurrency key's line excluded)",
            value=by_status.get(RunStatus.QUEUED, 0) - backing_off - in_line,
        )
        yield GaugeMetricFamily(
            "agentruns_runs_waiting_in_line",
            "Queued runs waiting behind another run of their concurrency key",
            value=in_line,
        )
        yield GaugeMetricFamily(
            "agentruns_runs_backing_off",
            "Queued runs waiting for a retry backoff (no thread, no lease)",
            value=backing_off,
        )
        yield from waiting_families(now)
        yield GaugeMetricFamily(
            "agentruns_cancel_requested_runs",
            "Live runs flagged for cancel, not yet at a step boundary",
            value=Run.objects.filter(
                status__in=[RunStatus.QUEUED, RunStatus.RUNNING], cancel_requested=True
            ).count(),
        )

        steps = GaugeMetricFamily(
            "agentruns_steps", "Steps by kind and outcome (status)", labels=["kind", "status"]
        )
        for kind, status, n in (
            Step.objects.order_by().values_list("kind", "status").annotate(n=Count("*"))
        ):
            steps.add_metric([kind, status], n)
        yield steps

        # the inbox: one query for every approval family (the inbox's port)
        yield from inbox().metric_families(now)

        usage = GaugeMetricFamily(
            "agentruns_model_tokens", "Model tokens used by all runs", labels=["kind"]
        )
        usage.add_metric(["prompt"], prompt_tokens)
        usage.add_metric(["completion"], completion_tokens)
        yield usage
        yield GaugeMetricFamily(
            "agentruns_model_cost_usd",
            "Model cost of all runs by AGENTRUNS_MODEL_PRICES",
            value=cost_usd,
        )

        beat = WorkerHeartbeat.objects.aggregate(
            seen=Max("last_seen_at"), swept=Max("last_sweep_at")
        )
        for name, doc, moment in (
            (
                "agentruns_worker_heartbeat_age_seconds",
                "Seconds since the freshest worker heartbeat",
                beat["seen"],
            ),
            ("agentruns_sweeper_age_seconds", "Seconds since the sweeper last ran", beat["swept"]),
        ):
            yield GaugeMetricFamily(
                name, doc, value=(now - moment).total_seconds() if moment else float("inf")
            )

        yield from pool_families(now)
        yield self.duration_histogram()
        yield GaugeMetricFamily(
            "agentruns_metrics_collect_seconds",
            "Time spent computing this scrape (uncached)",
            value=time.perf_counter() - started,
        )

    def duration_histogram(self) -> GaugeHistogramMetricFamily:
        """Durations of the newest `window` finished step attempts, bucketed by the database.

        The window is a primary-key range (`id > max(id) - window`), so the cost is bounded by
        the window, not the table. It is a gauge histogram (a window, not a counter since start):
        use `histogram_quantile(0.95, sum by (le) (agentruns_step_attempt_duration_seconds_bucket))`
        without `rate()`.
        """
        family = GaugeHistogramMetricFamily(
            "agentruns_step_attempt_duration_seconds",
            f"Duration of the newest {self.window} finished step attempts, by kind and outcome",
            labels=["kind", "outcome"],
        )
        top = StepAttempt.objects.aggregate(top=Max("id"))["top"] or 0
        duration = ExpressionWrapper(
            F("finished_at") - F("started_at"), output_field=DurationField()
        )
        aggregates = {
            f"le_{i}": Count("id", filter=Q(took__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(DURATION_BUCKETS)
        }
        # the step's kind by a correlated primary-key lookup per windowed attempt: a join would
        # let the planner hash the whole steps table on every scrape
        kind = Subquery(Step.objects.filter(id=OuterRef("step_id")).values("kind")[:1])
        rows = (
            StepAttempt.objects.filter(id__gt=top - self.window, finished_at__isnull=False)
            .annotate(took=duration, step_kind=kind)
            .order_by()
            .values("step_kind", "outcome")
            .annotate(n=Count("id"), total=Sum("took"), **aggregates)
        )
        for row in rows:
            buckets = [(str(bound), row[f"le_{i}"]) for i, bound in enumerate(DURATION_BUCKETS)]
            buckets.append(("+Inf", row["n"]))
            total = row["total"]
            family.add_metric(
                [row["step_kind"], row["outcome"]],
                buckets,
                gsum_value=total.total_seconds() if total is not None else 0.0,
            )
        return family


def waiting_families(now) -> Iterator[GaugeMetricFamily]:
    """Waiting runs by what they wait for, and how long the oldest has (selectors/waiting.py)."""
    waiting = GaugeMetricFamily(
        "agentruns_runs_waiting_for",
        "Waiting runs by what they wait for (approval, question, event, timer, message)",
        labels=["kind"],
    )
    oldest = GaugeMetricFamily(
        "agentruns_runs_waiting_for_oldest_seconds",
        "Seconds the longest-waiting run of each kind has waited",
        labels=["kind"],
    )
    by_kind = waiting_by_kind()
    for kind in WAIT_KINDS:
        n, since = by_kind.get(kind, (0, None))
        waiting.add_metric([kind], n)
        oldest.add_metric([kind], (now - since).total_seconds() if since else 0)
    yield waiting
    yield oldest


def render_metrics() -> bytes:
    """The families, computed now. With the database down the answer is this process's own
    view alone (`agentruns_process_database_up 0`), never an error page."""
    try:
        families = list(RuntimeCollector(window=conf.METRICS_WINDOW).collect())
        families += derived_families(families)
        database_up = True
    except DatabaseError:
        families, database_up = [], False
    families += list(process_families(database_up))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    return generate_latest(registry)


@operators_only
def metrics(request: HttpRequest) -> HttpResponse:
    ttl = conf.METRICS_CACHE_SECONDS
    body = cache.get(METRICS_CACHE_KEY) if ttl > 0 else None
    if body is None:
        body = render_metrics()
        if ttl > 0:
            cache.set(METRICS_CACHE_KEY, body, ttl)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
