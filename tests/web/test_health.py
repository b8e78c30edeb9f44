"""/healthz turns unhealthy with a stale worker heartbeat; /metrics parses as Prometheus text."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentruns.health import METRICS_CACHE_KEY
from agentruns.models import RunStatus, WorkerHeartbeat
from agentruns.runtime.workers.sweeper import record_heartbeat
from approvals.models import Approval
from tests import testkit
from tests.helpers import advance, script_run
from tests.testkit import OPS_AGENT

pytestmark = pytest.mark.django_db


def test_healthz_is_unhealthy_without_any_worker(client):
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert body["checks"]["database"]["ok"] is True
    assert (
        body["checks"]["worker"]["ok"] is False and body["checks"]["worker"]["last_seen_at"] is None
    )


def test_healthz_follows_the_worker_heartbeat(client, settings):
    settings.AGENTRUNS_WORKER_STALE_SECONDS = 30
    record_heartbeat("qcluster@test:1", swept=True)  # what the sweeper loop writes each pass
    fresh = client.get("/healthz")
    assert fresh.status_code == 200, fresh.content
    body = fresh.json()
    assert body["status"] == "ok" and body["checks"]["worker"]["live_workers"] == 1
    assert all(check["ok"] for check in body["checks"].values())

    # the worker stops beating (killed, hung, partitioned): 45 s later the check fails
    WorkerHeartbeat.objects.update(
        last_seen_at=timezone.now() - timedelta(seconds=45),
        last_sweep_at=timezone.now() - timedelta(seconds=45),
    )
    stale = client.get("/healthz")
    assert stale.status_code == 503
    checks = stale.json()["checks"]
    assert checks["worker"]["ok"] is False and checks["worker"]["age_seconds"] >= 45
    assert checks["sweeper"]["ok"] is False and checks["database"]["ok"] is True


def test_healthz_needs_the_sweeper_too(client):
    # a worker seen recently whose sweeper has not run (only the heartbeat, no sweep)
    WorkerHeartbeat.objects.create(
        worker="qcluster@test:2",
        last_seen_at=timezone.now(),
        last_sweep_at=timezone.now() - timedelta(hours=1),
    )
    response = client.get("/healthz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["worker"]["ok"] is True and checks["sweeper"]["ok"] is False


def families(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def samples(family, name: str | None = None) -> dict:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if name is None or s.name == name
    }


def test_metrics_parse_and_count(client):
    testkit.FAILS["t_charge"] = 1
    ok = advance(
        script_run(
            [{"calls": [["t_echo", {"text": "a"}], ["t_charge", {"amount": 1}]]}, {"text": "ok"}],
            agent=OPS_AGENT,
        )
    )
    assert ok.status == RunStatus.SUCCEEDED
    waiting = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}], agent=OPS_AGENT))
    assert waiting.status == RunStatus.WAITING
    script_run([{"text": "queued"}], agent=OPS_AGENT)
    Approval.objects.update(created_at=timezone.now() - timedelta(seconds=90))

    parsed = families(client)
    runs = samples(parsed["agentruns_runs"])
    assert runs[(("status", "succeeded"),)] == 1
    assert runs[(("status", "waiting"),)] == 1
    assert runs[(("status", "queued"),)] == 1
    assert runs[(("status", "failed"),)] == 0
    assert samples(parsed["agentruns_queue_depth"])[()] == 1
    assert samples(parsed["agentruns_oldest_pending_approval_age_seconds"])[()] >= 90
    steps = samples(parsed["agentruns_steps"])
    assert steps[(("kind", "tool"), ("status", "succeeded"))] == 2
    assert steps[(("kind", "tool"), ("status", "waiting_approval"))] == 1
    assert steps[(("kind", "model"), ("status", "succeeded"))] == 3

    histogram = parsed["agentruns_step_attempt_duration_seconds"]
    assert histogram.type == "histogram"
    buckets = [s for s in histogram.samples if s.name.endswith("_bucket")]
    inf = {
        (s.labels["kind"], s.labels["outcome"]): s.value
        for s in buckets
        if s.labels["le"] == "+Inf"
    }
    # 3 model turns, echo, the charge's retried attempt and its success (t_pay never ran)
    assert inf == {("model", "succeeded"): 3, ("tool", "succeeded"): 2, ("tool", "retrying"): 1}
    for (kind, outcome), total in inf.items():
        series = sorted(
            (float(s.labels["le"]), s.value)
            for s in buckets
            if s.labels["kind"] == kind and s.labels["outcome"] == outcome
        )
        counts = [v for _, v in series]
        assert counts == sorted(counts) and counts[-1] == total  # cumulative buckets


def test_metrics_cost_a_fixed_number_of_queries_and_are_cached(client, settings):
    for _ in range(3):
        advance(
            script_run([{"calls": [["t_echo", {"text": "a"}]]}, {"text": "ok"}], agent=OPS_AGENT)
        )
    with CaptureQueriesContext(connection) as few:
        families(client)
    for _ in range(10):
        advance(
            script_run(
                [{"calls": [["t_echo", {"text": "a"}]] * 3}, {"text": "ok"}], agent=OPS_AGENT
            )
        )
    with CaptureQueriesContext(connection) as many:
        families(client)
    assert len(few.captured_queries) == len(many.captured_queries) <= 12
    # rows are aggregated by the database: no query pulls attempt rows into Python
    assert not any(
        "finished_at" in q["sql"] and "COUNT" not in q["sql"].upper() for q in many.captured_queries
    )

    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 60
    try:
        families(client)
        with CaptureQueriesContext(connection) as cached:
            families(client)
        assert len(cached.captured_queries) == 0
    finally:
        cache.delete(METRICS_CACHE_KEY)  # the cache outlives this test's database
