"""Webhooks survive a SIGKILLed worker (a real `qcluster`, a real receiver on a loopback port):
the receiver fails every request at first, then one request hangs past the timeout, and the
worker is SIGKILLed while that request is in flight and the others wait for their retry. A new
worker takes over: every event arrives, verified with the `standardwebhooks` library, every try
of an event carries the same webhook-id and the same bytes, the hung delivery is tried again once
its lease expired, and nothing arrives for a decision whose transaction rolled back.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import Approval, ApprovalStatus, DeliveryStatus, WebhookDelivery
from approvals.notifications.signing import new_secret
from tests.procs import start_worker, wait_until
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash, pytest.mark.slow]

TIMEOUT = 1.0  # per try; the lease is 3 x timeout + 5 s
PAY = [{"text": "Paying.", "calls": [["t_pay", {"amount": 500}]]}, {"text": "Paid."}]


class Rollback(Exception):
    pass


def test_every_event_arrives_at_least_once_across_a_sigkill(tmp_path, settings):
    secret = new_secret()
    receiver = Receiver(fail_until_armed=True, hang_once=True, hang_seconds=8).start()
    hooks = {
        "AGENTRUNS_WEBHOOK_URL": receiver.url,
        "AGENTRUNS_WEBHOOK_SECRET": secret,
        "AGENTRUNS_WEBHOOK_TIMEOUT_SECONDS": TIMEOUT,
        "AGENTRUNS_WEBHOOK_RETRY_BASE_SECONDS": 0.2,
        "AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS": 1,
        "AGENTRUNS_WEBHOOK_MAX_ATTEMPTS": 100,
        "AGENTRUNS_WEBHOOK_POLL_SECONDS": 0.1,
        "AGENTRUNS_WEBHOOK_CONCURRENCY": 2,
    }
    for name, value in hooks.items():  # decisions made here write their events with these
        setattr(settings, name, value)
    env = {**hooks, "AGENTRUNS_AGENT_MODULES": "tests.testkit", "AGENTRUNS_APPROVAL_EMAILS": 0}
    lead = get_user_model().objects.create_superuser("lead", "lead@example.com", "pw")
    workers = [start_worker(tmp_path, name="worker-1", **env)]
    try:
        # the events: two items opened and a run failing (by the worker), a decision (here)
        paid = [start_run("script", {"script": PAY}).run for _ in range(2)]
        failing = start_run("script", {"script": [{"calls": [["t_explode", {}]]}]}).run
        approvals = [
            wait_until(lambda r=r: Approval.objects.filter(run=r).first(), timeout=90) for r in paid
        ]
        wait_until(lambda: Run.objects.get(id=failing.id).status == RunStatus.FAILED, timeout=90)
        services.approve(approvals[0].id, user=lead, reason="fine")
        with pytest.raises(Rollback), transaction.atomic():
            services.reject(approvals[1].id, user=lead, reason="ROLLED-BACK-DECISION")
            raise Rollback
        expected = ["approval.requested", "approval.requested", "run.failed", "approval.decided"]
        wait_until(lambda: WebhookDelivery.objects.count() >= 4, timeout=30)
        # every event has been tried and refused at least once
        wait_until(lambda: all(d.attempts >= 1 for d in WebhookDelivery.objects.all()), timeout=60)

        receiver.arm()  # the next request hangs past the timeout...
        assert receiver.hanging.wait(60), "no request after arming"
        workers[0].kill()  # ...and the worker dies with it in flight
        pending = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING)
        assert pending.exists()
        in_flight = WebhookDelivery.objects.filter(lease_owner__startswith="deliveries@")
        hung_id = next(r.webhook_id for r in receiver.snapshot() if r.answer == "hang")
        assert in_flight.filter(webhook_id=hung_id).exists()  # its lease held by the dead one

        workers.append(start_worker(tmp_path, name="worker-2", **env))
        wait_until(
            lambda: not WebhookDelivery.objects.exclude(status=DeliveryStatus.DELIVERED).exists(),
            timeout=120,
            message="every delivery to be delivered",
        )
    finally:
        for w in workers:
            w.stop()
        receiver.stop()

    rows = list(WebhookDelivery.objects.order_by("id"))
    assert sorted(r.event_type for r in rows) == sorted(expected)
    got = receiver.snapshot()
    events = receiver.verified(secret)  # every single request verifies
    assert len(events) == len(got) > len(rows)
    for row in rows:
        tries = [r for r in got if r.webhook_id == row.webhook_id]
        assert any(t.answer == "200" for t in tries), row.event_type  # arrived
        assert {t.body for t in tries} == {row.body}  # every try: same id, same bytes
        assert any(t.answer == "500" for t in tries)  # ...and it was a retry
        assert row.attempts <= len(tries)
    hung = [r for r in got if r.webhook_id == hung_id]
    assert [t.answer for t in hung][-2:] == ["hang", "200"]  # tried again after the lease
    # the rolled-back decision never happened, so nothing reports it
    assert all("ROLLED-BACK-DECISION" not in r.body for r in got)
    assert Approval.objects.get(id=approvals[1].id).status == ApprovalStatus.PENDING
    decided = [e for e in events if e["type"] == "approval.decided"]
    assert {e["data"]["approval"]["id"] for e in decided} == {approvals[0].id}
    failed = [e for e in events if e["type"] == "run.failed"]
    assert {e["data"]["run"]["id"] for e in failed} == {str(failing.id)}
