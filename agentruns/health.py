"""/healthz (JSON, 503 when unhealthy) and /metrics (Prometheus text)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Min
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .models import Run, RunStatus, Step, StepAttempt, WorkerHeartbeat


def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": type(exc).__name__}
        return JsonResponse({"status": "unhealthy", "checks": checks}, status=503)
    now = timezone.now()
    stale = timedelta(seconds=float(settings.AGENTRUNS_WORKER_STALE_SECONDS))
    beat = WorkerHeartbeat.objects.aggregate(seen=Max("last_seen_at"), swept=Max("last_sweep_at"))
    seen, swept = beat["seen"], beat["swept"]
    checks["worker"] = {
        "ok": bool(seen and now - seen <= stale),
        "last_seen_at": seen.isoformat() if seen else None,
    }
    checks["sweeper"] = {
        "ok": bool(swept and now - swept <= stale),
        "last_sweep_at": swept.isoformat() if swept else None,
    }
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", "checks": checks}, status=200 if healthy else 503
    )


DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def metrics(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry()
    runs = Gauge("agentruns_runs", "Runs by status", ["status"], registry=registry)
    counts = dict(Run.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    for status in RunStatus.values:
        runs.labels(status).set(counts.get(status, 0))
    steps = Gauge("agentruns_steps", "Steps by status", ["kind", "status"], registry=registry)
    for kind, status, n in Step.objects.values_list("kind", "status").annotate(n=Count("id")):
        steps.labels(kind, status).set(n)
    Gauge("agentruns_queue_depth", "Runs queued for a worker", registry=registry).set(
        counts.get(RunStatus.QUEUED, 0)
    )
    from approvals.models import Approval

    oldest = Approval.objects.filter(status="pending").aggregate(o=Min("created_at"))["o"]
    Gauge(
        "agentruns_oldest_pending_approval_seconds", "Age of the oldest pending approval",
        registry=registry,
    ).set((timezone.now() - oldest).total_seconds() if oldest else 0)
    tokens = Gauge("agentruns_tokens", "Model tokens used", ["kind"], registry=registry)
    for kind in ("prompt_tokens", "completion_tokens"):
        from django.db.models import Sum

        tokens.labels(kind.split("_")[0]).set(Run.objects.aggregate(t=Sum(kind))["t"] or 0)
    histogram = Histogram(
        "agentruns_step_attempt_duration_seconds", "Duration of finished step attempts (last 10,000)",
        ["outcome"], buckets=DURATION_BUCKETS, registry=registry,
    )
    recent = StepAttempt.objects.filter(finished_at__isnull=False).order_by("-id")[:10000]
    for outcome, started, finished in recent.values_list("outcome", "started_at", "finished_at"):
        histogram.labels(outcome).observe(max(0.0, (finished - started).total_seconds()))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
