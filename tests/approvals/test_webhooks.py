"""The outbox and its deliveries, in process against a real local HTTP receiver: one row per
event and endpoint written in the change's transaction (nothing for a rollback), signed
Standard Webhooks requests (checked with the `standardwebhooks` library), retries with the same
webhook id, failed after the last try, redelivery from the admin, leases and SKIP LOCKED."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.db import transaction
from django.test import Client
from standardwebhooks import Webhook

from agentruns.models import RunStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from approvals.notifications import delivery, outbox
from approvals.notifications.signing import new_secret
from tests.approvals.kit import SECRET, parked_approval, unknown_step_approval
from tests.helpers import advance, race
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    r = Receiver(fail_first=2, hang_once=True, hang_seconds=1.5).start()
    yield r
    r.stop()


@pytest.fixture
def hook(settings, receiver):
    secret = new_secret()
    settings.AGENTRUNS_WEBHOOK_URL = receiver.url
    settings.AGENTRUNS_WEBHOOK_SECRET = secret
    settings.AGENTRUNS_WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.AGENTRUNS_WEBHOOK_RETRY_BASE_SECONDS = 0.01
    settings.AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS = 0.05
    settings.AGENTRUNS_WEBHOOK_MAX_ATTEMPTS = 6
    settings.APP_BASE_URL = "https://inbox.example"
    return secret


def deliveries(event_type: str | None = None) -> list[WebhookDelivery]:
    rows = WebhookDelivery.objects.order_by("id")
    return list(rows.filter(event_type=event_type) if event_type else rows)


def pump(until, *, owner: str = "test-worker", timeout: float = 30) -> None:
    """Run delivery passes (as the worker's loop does) until `until()` holds."""
    deadline = time.monotonic() + timeout
    with httpx.Client() as client:
        while not until():
            assert time.monotonic() < deadline, "deliveries did not settle"
            if not delivery.deliver_due(owner, client):
                time.sleep(0.02)


def test_an_opened_item_writes_one_delivery_per_endpoint_that_wants_it(hook):
    everything = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/all", secret=new_secret())
    WebhookEndpoint.objects.create(
        url="http://127.0.0.1:9/failures", secret=new_secret(), event_types=["run.failed"]
    )
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/off", secret=new_secret(), active=False)
    approval = parked_approval()
    rows = deliveries("approval.requested")
    assert [r.endpoint_id for r in rows] == [None, everything.id]
    assert len({r.webhook_id for r in rows}) == 1 and rows[0].webhook_id.startswith("msg_")
    assert rows[0].body == rows[1].body
    event = json.loads(rows[0].body)
    assert event["type"] == "approval.requested" and event["timestamp"]
    data = event["data"]
    assert data["approval"]["id"] == approval.id and data["run"]["id"] == str(approval.run_id)
    assert data["approval"]["url"] == f"https://inbox.example/approvals/{approval.id}/"
    assert data["approval"]["amount_cents"] == 4599 and data["approval"]["status"] == "pending"
    # redacted like the inbox: the tool marks card_token secret
    assert SECRET not in rows[0].body and data["approval"]["args"]["card_token"] == "••••••"


def test_a_decision_that_rolls_back_leaves_no_event_and_one_that_commits_does(hook, approver):
    approval = parked_approval()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.approve(approval.id, user=approver, reason="ROLLED-BACK")
        assert deliveries("approval.decided")  # written in the decision's transaction...
        raise RuntimeError("the request failed after the decision")
    assert deliveries("approval.decided") == []  # ...and gone with it
    services.reject(approval.id, user=approver, reason="not this one")
    (row,) = deliveries("approval.decided")
    data = json.loads(row.body)["data"]["approval"]
    assert data["status"] == "rejected" and data["decided_by"] == "approver"
    assert data["reason"] == "not this one"


def test_every_way_a_run_fails_reports_run_failed(hook, approver):
    run = start_run("script", {"script": [{"calls": [["t_explode", {}]]}]}).run
    run = advance(run)
    assert run.status == RunStatus.FAILED
    (row,) = deliveries("run.failed")
    data = json.loads(row.body)["data"]
    assert data["approval"] is None and data["run"]["id"] == str(run.id)
    assert data["run"]["status"] == "failed" and "card declined" in data["run"]["error"]
    # staff abort a run after an unknown outcome: the run fails through the decision
    item = unknown_step_approval()
    services.reconcile(item.id, user=approver, resolution="abort")
    assert [json.loads(r.body)["data"]["run"]["id"] for r in deliveries("run.failed")] == [
        str(run.id),
        str(item.run_id),
    ]


def test_500s_then_a_timeout_then_accepted_with_the_same_webhook_id(hook, receiver):
    approval = parked_approval()
    (row,) = deliveries()
    pump(lambda: WebhookDelivery.objects.get(id=row.id).status == DeliveryStatus.DELIVERED)
    got = receiver.snapshot()
    assert [r.answer for r in got] == ["500", "500", "hang", "200"]
    assert {r.webhook_id for r in got} == {row.webhook_id}  # retries keep their id
    assert {r.body for r in got} == {row.body}  # and their bytes
    assert len({r.headers["webhook-timestamp"] for r in got}) >= 1
    for event in receiver.verified(hook):  # every try verifies with the reference library
        assert event["data"]["approval"]["id"] == approval.id
    with pytest.raises(Exception):  # noqa: B017 - a wrong secret must not verify
        Webhook(new_secret()).verify(got[-1].body, got[-1].headers)
    row.refresh_from_db()
    assert row.attempts == 4 and row.last_status_code == 200 and row.delivered_at
    assert [e["status"] for e in row.attempt_log] == [500, 500, None, 200]
    assert "timed out" in row.attempt_log[2]["error"]
    assert row.lease_owner == "" and row.lease_expires_at is None


def test_failed_after_the_last_try_then_redelivered_from_the_admin(hook, receiver, settings, lead):
    settings.AGENTRUNS_WEBHOOK_MAX_ATTEMPTS = 2  # the receiver fails twice, then hangs once
    parked_approval()
    (row,) = deliveries()
    pump(lambda: WebhookDelivery.objects.get(id=row.id).status == DeliveryStatus.FAILED)
    row.refresh_from_db()
    assert row.attempts == 2 and row.last_status_code == 500
    assert row.last_response == "receiver is down"
    admin = Client()
    admin.force_login(lead)
    page = admin.get(f"/admin/approvals/webhookdelivery/{row.id}/change/").content.decode()
    assert "receiver is down" in page and row.webhook_id in page and "500" in page
    listing = admin.get("/admin/approvals/webhookdelivery/?status=failed").content.decode()
    assert "redeliver_selected" in listing
    response = admin.post(
        "/admin/approvals/webhookdelivery/",
        {"action": "redeliver_selected", "_selected_action": [row.id]},
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.status == DeliveryStatus.PENDING and row.attempts == 0
    # a fresh budget of two tries: the receiver's one hang (a timeout), then accepted
    pump(lambda: WebhookDelivery.objects.get(id=row.id).status == DeliveryStatus.DELIVERED)
    got = receiver.snapshot()
    assert [r.answer for r in got] == ["500", "500", "hang", "200"]
    assert {r.webhook_id for r in got} == {row.webhook_id}


def test_the_admin_endpoint_form_keeps_and_generates_secrets(lead):
    admin = Client()
    admin.force_login(lead)
    response = admin.post(
        "/admin/approvals/webhookendpoint/add/",
        {"url": "https://hooks.example/in", "description": "ops", "secret": "", "active": "on"},
        follow=True,
    )
    assert response.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret.startswith("whsec_") and endpoint.event_types == []
    assert endpoint.secret in response.content.decode()  # shown once, to copy
    listing = admin.get("/admin/approvals/webhookendpoint/").content.decode()
    assert endpoint.secret not in listing
    refused = admin.post(
        f"/admin/approvals/webhookendpoint/{endpoint.id}/change/",
        {"url": "https://hooks.example/in", "secret": "not-a-secret", "active": "on"},
    )
    assert refused.status_code == 200 and "whsec_" in refused.content.decode()
    kept = endpoint.secret
    admin.post(
        f"/admin/approvals/webhookendpoint/{endpoint.id}/change/",
        {"url": "https://hooks.example/v2", "secret": "", "event_types": ["run.failed"]},
    )
    endpoint.refresh_from_db()
    assert endpoint.secret == kept and endpoint.url.endswith("/v2")
    assert endpoint.event_types == ["run.failed"] and not endpoint.active


def test_the_default_schedule_retries_for_more_than_a_day():
    assert delivery.shortest_retry_span() > 24 * 3600
    delays = [delivery.retry_delay(n, jitter=0) for n in range(1, 12)]
    assert delays == sorted(delays) and delays[0] == 5
    jittered = {round(delivery.retry_delay(3), 3) for _ in range(20)}
    assert len(jittered) > 1 and all(64 <= d <= 96 for d in jittered)


def _rows(n: int) -> list[WebhookDelivery]:
    return WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(webhook_id=outbox.new_webhook_id(), event_type="run.failed", body="{}")
            for _ in range(n)
        ]
    )


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_claim_the_same_delivery_and_an_expired_claim_is_taken_over():
    _rows(20)

    def work(owner: str) -> list[int]:
        return [r.id for r in delivery.claim_due(owner, 12)]

    claimed = dict(zip(["w0", "w1"], race(lambda: work("w0"), lambda: work("w1")), strict=True))
    assert not set(claimed["w0"]) & set(claimed["w1"])
    assert len(claimed["w0"]) + len(claimed["w1"]) == 20
    assert delivery.claim_due("w2", 20) == []  # every lease is live
    # w0 "dies": its leases run out and w2 takes the rows over; w0's late answer is dropped
    row = WebhookDelivery.objects.get(id=claimed["w0"][0])
    WebhookDelivery.objects.filter(lease_owner="w0").update(lease_expires_at="2000-01-01T00:00Z")
    taken = delivery.claim_due("w2", 20)
    assert {r.id for r in taken} == set(claimed["w0"])
    assert not delivery.record(row, "w0", delivery.Outcome(status_code=200))
    assert WebhookDelivery.objects.get(id=row.id).status == DeliveryStatus.PENDING
    assert delivery.record(taken[0], "w2", delivery.Outcome(status_code=204))
    assert WebhookDelivery.objects.get(id=taken[0].id).status == DeliveryStatus.DELIVERED
