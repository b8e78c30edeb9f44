"""The /metrics families an on-call pages on (agentruns/oncall_metrics.py), and the alert rules
of docs/alerts.yml: valid for promtool, and every metric they name is in a real /metrics answer."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentruns.health import METRICS_CACHE_KEY
from agentruns.models import Run, RunStatus, WorkerHeartbeat
from agentruns.runtime.workers.sweeper import record_heartbeat
from approvals.models import Approval, DeliveryStatus, WebhookDelivery
from tests import binaries
from tests.helpers import advance, script_run
from tests.testkit import OPS_AGENT

# the database is marked on the tests that use it, not on the module: tests/test_binaries.py runs
# the promtool test in a pytest of its own, which would create a test database only to skip it
ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "docs" / "alerts.yml"
OPERATIONS = ROOT / "docs" / "operations.md"


def scrape(client) -> dict[str, dict[tuple, float]]:
    """sample name -> {sorted labels: value} of a real /metrics answer."""
    cache.delete(METRICS_CACHE_KEY)
    response = client.get("/metrics")
    assert response.status_code == 200
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.fixture
def busy_system():
    """Two parked runs (one overdue), a stuck webhook delivery, failed runs, worker heartbeats
    with what those processes saw."""
    now = timezone.now()
    for _ in range(2):
        run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}], agent=OPS_AGENT))
        assert run.status == RunStatus.WAITING
    first, second = Approval.objects.order_by("id")
    Approval.objects.filter(id=first.id).update(
        created_at=now - timedelta(hours=2), due_at=now - timedelta(hours=1)
    )
    Approval.objects.filter(id=second.id).update(created_at=now - timedelta(seconds=120))
    WebhookDelivery.objects.create(webhook_id="msg_1", event_type="run.failed", body="{}")
    WebhookDelivery.objects.filter(webhook_id="msg_1").update(created_at=now - timedelta(hours=1))
    WebhookDelivery.objects.create(
        webhook_id="msg_2", event_type="run.failed", body="{}", status=DeliveryStatus.DELIVERED
    )
    failed = advance(script_run([{"text": "x"}], agent=OPS_AGENT))
    Run.objects.filter(id=failed.id).update(status=RunStatus.FAILED)
    record_heartbeat("qcluster@host-a:10", swept=True)
    WorkerHeartbeat.objects.create(
        worker="pool@host-a:11",
        last_seen_at=now,
        runs_in_flight=7,
        run_capacity=10,
        process_health={
            "database": {"up": True, "errors": 3},
            "redis": {"up": False, "errors": 2},
            "model_errors": {"rate_limited": 4, "server_error": 1},
        },
    )
    WorkerHeartbeat.objects.create(  # a worker that stopped reporting (it cannot reach us)
        worker="pool@host-b:12", last_seen_at=now - timedelta(minutes=5), run_capacity=10
    )


@pytest.mark.django_db
def test_oncall_families(client, busy_system):
    got = scrape(client)
    agent = (("agent", OPS_AGENT),)
    assert got["agentruns_pending_approvals_by_agent"][agent] == 2
    assert got["agentruns_approvals_overdue"][agent] == 1
    buckets = {dict(k)["le"]: v for k, v in got["agentruns_approval_age_seconds_bucket"].items()}
    assert buckets["60.0"] == 0 and buckets["300.0"] == 1 and buckets["3600.0"] == 1
    assert buckets["14400.0"] == 2 and buckets["+Inf"] == 2
    assert 7300 < got["agentruns_approval_age_seconds_gsum"][agent] < 7400
    assert got["agentruns_pending_approvals"][(("kind", "approval"),)] == 2
    assert got["agentruns_oldest_pending_approval_age_seconds"][()] > 7100

    assert got["agentruns_webhook_outbox_backlog"][()] == 1
    assert 3500 < got["agentruns_webhook_outbox_oldest_undelivered_age_seconds"][()] < 3700

    assert got["agentruns_worker_pool_slots_free"] == {(("worker", "host-a:11"),): 3}
    assert got["agentruns_runs_ended_total"][(("status", "failed"),)] == 1

    up = got["agentruns_process_database_up"]
    assert up[(("process", "host-a:11"), ("role", "worker"))] == 1
    assert up[(("process", "host-b:12"), ("role", "worker"))] == 0  # stale heartbeat
    (web,) = [k for k in up if dict(k)["role"] == "web"]
    assert up[web] == 1
    assert got["agentruns_process_redis_up"] == {(("process", "host-a:11"), ("role", "worker")): 0}
    errors = got["agentruns_model_provider_errors_total"]
    assert errors[(("class", "rate_limited"), ("process", "host-a:11"), ("role", "worker"))] == 4
    db_errors = got["agentruns_process_database_errors_total"]
    assert db_errors[(("process", "host-a:11"), ("role", "worker"))] == 3


def test_model_error_classes():
    import httpx

    from agentruns.runtime.outages.process_health import model_error_class
    from agentruns.runtime.providers import ModelError

    def chained(outer: Exception, inner: Exception) -> Exception:
        outer.__cause__ = inner
        return outer

    assert model_error_class(ModelError("HTTP 429 Too Many Requests")) == "rate_limited"
    assert model_error_class(ModelError("model server answered 503")) == "server_error"
    assert model_error_class(ModelError("HTTP 400: bad request")) == "client_error"
    timeout = chained(ModelError("no answer"), httpx.ReadTimeout("slow"))
    assert model_error_class(timeout) == "timeout"
    refused = chained(ModelError("down"), httpx.ConnectError("refused"))
    assert model_error_class(refused) == "connection"
    assert model_error_class(ModelError("the model said nonsense")) == "other"


# ------------------------------------------------------------------ docs/alerts.yml
def alert_rules() -> list[dict]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_five_alerts_each_with_a_runbook():
    rules = alert_rules()
    assert len(rules) == 5
    runbooks = OPERATIONS.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in runbooks.splitlines()
        if line.startswith("#")
    }
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/operations.md" and anchor in headings, url
        assert rule["labels"]["severity"] == "page"


def test_promtool_accepts_the_rules():
    promtool = binaries.require("promtool", "checking docs/alerts.yml")
    done = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


FUNCTIONS = {"sum", "by", "rate", "min", "max", "and", "or", "absent", "on", "without"}


@pytest.mark.django_db
def test_every_metric_an_alert_names_is_in_metrics(client, busy_system):
    exposed = scrape(client)
    for rule in alert_rules():
        expr = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", rule["expr"])
        names = {n for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if n not in FUNCTIONS}
        names -= {"process", "role", "agent", "status"}  # grouping labels
        assert names, rule["alert"]
        for name in names:
            assert name in exposed, f"{rule['alert']}: {name} is not in /metrics"
        for label in re.findall(r"(\w+)=", rule["expr"]):
            assert any(label in dict(key) for name in names for key in exposed[name]), (
                f"{rule['alert']}: no series with label {label}"
            )
