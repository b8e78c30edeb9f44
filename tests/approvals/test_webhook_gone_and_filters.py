"""Webhook behaviours the README promises that test_webhooks.py does not hold: a 410 Gone
switches an admin endpoint off (one try, no retries, nothing sent to it afterwards), a
`Retry-After` (seconds or an HTTP-date, capped) sets the next try,
AGENTRUNS_WEBHOOK_EVENTS filters what the settings URL is sent, and a cancelled run's pending
item reports `approval.withdrawn`. Checked against a real local HTTP receiver and the outbox."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agentruns.services import cancel_run
from approvals.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from approvals.notifications import delivery
from approvals.notifications.signing import new_secret
from tests.approvals.kit import parked_approval

pytestmark = pytest.mark.django_db


class StatusReceiver:
    """Answers every POST with `status` (and `headers`) and counts what it got."""

    def __init__(self, status: int = 410, headers: dict[str, str] | None = None) -> None:
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.paths.append(self.path)
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/gone"


@pytest.fixture
def gone():
    r = StatusReceiver(410)
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def fast(settings):
    settings.AGENTRUNS_WEBHOOK_URL = ""
    settings.AGENTRUNS_WEBHOOK_TIMEOUT_SECONDS = 2
    settings.AGENTRUNS_WEBHOOK_RETRY_BASE_SECONDS = 0.01
    settings.AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS = 0.05
    settings.AGENTRUNS_WEBHOOK_MAX_ATTEMPTS = 6


def pump_until_settled(timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client() as client:
        while WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists():
            assert time.monotonic() < deadline, "deliveries did not settle"
            if not delivery.deliver_due("test-worker", client):
                time.sleep(0.02)


def test_a_410_gone_fails_the_delivery_at_once_and_switches_the_endpoint_off(fast, gone):
    endpoint = WebhookEndpoint.objects.create(url=gone.url, secret=new_secret())
    parked_approval()
    (row,) = WebhookDelivery.objects.filter(endpoint=endpoint)
    pump_until_settled()
    row.refresh_from_db()
    assert row.status == DeliveryStatus.FAILED and row.attempts == 1
    assert row.last_status_code == 410
    assert gone.paths == ["/gone"]  # one try, no retries
    endpoint.refresh_from_db()
    assert endpoint.active is False and "410" in endpoint.disabled_reason
    # the next event is not sent to it
    parked_approval()
    pump_until_settled()
    assert gone.paths == ["/gone"]


@pytest.mark.parametrize(
    "retry_after, waited",
    [
        ("30", 30),  # delay-seconds
        ("in 45 s, as an HTTP-date", 45),
        ("99999", 120),  # never past AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS
        ("soon", 0),  # unreadable: the backoff alone (0.01 s here)
    ],
)
def test_a_retry_after_sets_the_next_try(fast, settings, retry_after, waited):
    settings.AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS = 120
    if retry_after.endswith("HTTP-date"):
        retry_after = format_datetime(datetime.now(UTC) + timedelta(seconds=45), usegmt=True)
    busy = StatusReceiver(503, {"Retry-After": retry_after})
    try:
        endpoint = WebhookEndpoint.objects.create(url=busy.url, secret=new_secret())
        parked_approval()
        (row,) = WebhookDelivery.objects.filter(endpoint=endpoint)
        with httpx.Client() as client:
            assert delivery.deliver_due("test-worker", client)
    finally:
        busy.server.shutdown()
        busy.server.server_close()
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING and row.attempts == 1
    assert row.last_status_code == 503 and busy.paths == ["/gone"]
    delay = (row.next_attempt_at - row.last_attempt_at).total_seconds()
    assert waited - 1.5 <= delay <= waited + 1, delay  # an HTTP-date has whole seconds


def test_agentruns_webhook_events_filters_what_the_settings_url_gets(fast, settings):
    settings.AGENTRUNS_WEBHOOK_URL = "http://127.0.0.1:9/hooks"
    settings.AGENTRUNS_WEBHOOK_SECRET = new_secret()
    settings.AGENTRUNS_WEBHOOK_EVENTS = "run.failed, approval.withdrawn"
    approval = parked_approval()
    assert not WebhookDelivery.objects.filter(event_type="approval.requested").exists()
    cancel_run(approval.run_id, reason="customer withdrew")
    (row,) = WebhookDelivery.objects.filter(event_type="approval.withdrawn", endpoint=None)
    data = json.loads(row.body)["data"]
    assert data["approval"]["id"] == approval.id
    assert data["run"]["id"] == str(approval.run_id)


def test_a_cancelled_runs_pending_item_reports_approval_withdrawn(fast, settings):
    settings.AGENTRUNS_WEBHOOK_URL = "http://127.0.0.1:9/hooks"
    settings.AGENTRUNS_WEBHOOK_SECRET = new_secret()
    approval = parked_approval()
    assert [r.event_type for r in WebhookDelivery.objects.order_by("id")] == ["approval.requested"]
    cancel_run(approval.run_id, reason="customer withdrew")
    types = [r.event_type for r in WebhookDelivery.objects.order_by("id")]
    assert types[:2] == ["approval.requested", "approval.withdrawn"]
    (row,) = WebhookDelivery.objects.filter(event_type="approval.withdrawn")
    assert json.loads(row.body)["data"]["approval"]["id"] == approval.id
