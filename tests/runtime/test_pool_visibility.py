"""What operators see of the run pools: /healthz and /metrics report runs in flight and
capacity per worker process (from the pools' heartbeats), the runs list and the API show which
worker process holds a running run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentruns.health import METRICS_CACHE_KEY
from agentruns.models import Run, RunStatus, WorkerHeartbeat
from agentruns.runtime.workers import sweeper
from agentruns.runtime.workers.sweeper import record_heartbeat
from agentruns.services import start_run
from tests.conftest import ApiClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def pools():
    record_heartbeat("qcluster@host-a:10", swept=True)
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        worker="pool@host-a:11", last_seen_at=now, runs_in_flight=37, run_capacity=100
    )
    WorkerHeartbeat.objects.create(
        worker="pool@host-a:12",
        last_seen_at=now,
        runs_in_flight=3,
        run_capacity=100,
        draining=True,
        db_connections=4,
    )
    # a worker process that died long ago: its row must not count
    WorkerHeartbeat.objects.create(
        worker="pool@host-b:13",
        last_seen_at=now - timedelta(minutes=10),
        runs_in_flight=99,
        run_capacity=100,
    )
    cache.delete(METRICS_CACHE_KEY)


def test_healthz_reports_runs_in_flight_and_capacity_per_process(client, pools):
    worker = client.get("/healthz").json()["checks"]["worker"]
    assert worker["runs_in_flight"] == 40
    assert worker["run_capacity"] == 100  # a draining process takes no new runs
    assert [(p["worker"], p["runs_in_flight"], p["draining"]) for p in worker["processes"]] == [
        ("host-a:11", 37, False),
        ("host-a:12", 3, True),
    ]


def test_metrics_report_runs_in_flight_and_capacity_per_process(client, pools):
    body = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    in_flight = {
        s.labels["worker"]: s.value for s in families["agentruns_worker_runs_in_flight"].samples
    }
    assert in_flight == {"host-a:11": 37, "host-a:12": 3}
    capacity = {
        s.labels["worker"]: s.value for s in families["agentruns_worker_run_capacity"].samples
    }
    assert capacity == {"host-a:11": 100, "host-a:12": 100}
    draining = {s.labels["worker"]: s.value for s in families["agentruns_worker_draining"].samples}
    assert draining == {"host-a:11": 0, "host-a:12": 1}
    assert families["agentruns_runs_in_flight"].samples[0].value == 40
    assert families["agentruns_run_capacity"].samples[0].value == 100


def test_a_backing_off_run_is_not_queue_depth(client):
    due = start_run("script", {"script": []}, enqueue_task=False).run
    Run.objects.filter(id=due.id).update(enqueued_at=timezone.now() + timedelta(seconds=30))
    start_run("script", {"script": []}, enqueue_task=False)
    cache.delete(METRICS_CACHE_KEY)
    body = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["agentruns_queue_depth"].samples[0].value == 1
    assert families["agentruns_runs_backing_off"].samples[0].value == 1


def test_the_runs_list_and_the_api_show_the_worker_of_a_running_run(client, lead):
    running = start_run("script", {"script": []}, enqueue_task=False).run
    Run.objects.filter(id=running.id).update(
        status=RunStatus.RUNNING,
        lease_owner="host-a:11:9f3c2e",
        lease_expires_at=timezone.now() + timedelta(seconds=15),
    )
    queued = start_run("script", {"script": []}, enqueue_task=False).run
    client.force_login(lead)
    page = client.get("/runs/").content.decode()
    assert "on <code>host-a:11</code>" in page
    assert page.count("run-worker") == 1  # the queued run is on no worker
    api = ApiClient(lead)
    assert api.get(f"/api/runs/{running.id}").json()["worker"] == "host-a:11"
    assert api.get(f"/api/runs/{queued.id}").json()["worker"] is None


def test_heartbeats_gone_for_an_hour_are_pruned_at_most_once_a_minute(monkeypatch):
    monkeypatch.setattr(sweeper, "_pruned_at", None)  # this process has not pruned yet
    gone = timezone.now() - timedelta(hours=2)
    WorkerHeartbeat.objects.create(worker="pool@gone:1", last_seen_at=gone)
    record_heartbeat("qcluster@here:1", swept=True)
    assert not WorkerHeartbeat.objects.filter(worker="pool@gone:1").exists()
    WorkerHeartbeat.objects.create(worker="pool@gone:2", last_seen_at=gone)
    record_heartbeat("qcluster@here:1", swept=True)  # the next pass, within the minute
    assert WorkerHeartbeat.objects.filter(worker="pool@gone:2").exists()
    assert WorkerHeartbeat.objects.filter(worker="qcluster@here:1").exists()
