"""Escalation with two real workers (`qcluster` x 2) and a short due time: their sweepers race
for every item, and each item escalates exactly once: one `approval.escalated` on its timeline,
one webhook event (checked at a real receiver, signatures verified), one mail notice."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import RunEvent, WorkerHeartbeat
from approvals.models import Approval, DeliveryStatus, MailNotice, WebhookDelivery
from approvals.notifications.signing import new_secret
from tests.approvals.kit import bulk_pending
from tests.procs import start_worker, wait_until
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ITEMS = 8


def test_two_workers_escalate_each_item_exactly_once(tmp_path):
    secret = new_secret()
    receiver = Receiver().start()
    env = {
        "AGENTRUNS_SWEEP_INTERVAL_SECONDS": 0.1,
        "AGENTRUNS_WEBHOOK_URL": receiver.url,
        "AGENTRUNS_WEBHOOK_SECRET": secret,
        "AGENTRUNS_WEBHOOK_POLL_SECONDS": 0.1,
        "AGENTRUNS_AGENT_MODULES": "tests.testkit",
    }
    workers = [start_worker(tmp_path, name=f"worker-{i}", **env) for i in range(2)]
    try:
        started = timezone.now()
        wait_until(
            lambda: WorkerHeartbeat.objects.filter(last_sweep_at__gt=started).count() == 2,
            timeout=90,
            message="both sweepers running",
        )
        items = bulk_pending(ITEMS)
        Approval.objects.filter(id__in=[a.id for a in items]).update(
            due_at=timezone.now() + timedelta(seconds=1)
        )
        wait_until(
            lambda: not Approval.objects.filter(escalated_at__isnull=True).exists(),
            timeout=60,
            message="every item to escalate",
        )
        wait_until(
            lambda: (
                WebhookDelivery.objects.filter(status=DeliveryStatus.DELIVERED).count() >= ITEMS
            ),
            timeout=60,
            message="the escalations to be delivered",
        )
        assert WorkerHeartbeat.objects.filter(last_sweep_at__gt=started).count() == 2
    finally:
        for w in workers:
            w.stop()
        receiver.stop()
    per_item = Counter(
        WebhookDelivery.objects.filter(event_type="approval.escalated").values_list(
            "approval_id", flat=True
        )
    )
    assert per_item == {a.id: 1 for a in items}
    events = [e for e in receiver.verified(secret) if e["type"] == "approval.escalated"]
    ids = {r.webhook_id for r in receiver.snapshot()}
    assert len(ids) == ITEMS  # one event per item (a retry would repeat an id, not add one)
    assert Counter(e["data"]["approval"]["id"] for e in events) == {a.id: 1 for a in items}
    for approval in items:
        assert (
            RunEvent.objects.filter(run_id=approval.run_id, type="approval.escalated").count() == 1
        )
        assert MailNotice.objects.filter(approval=approval, kind="escalated").count() == 1
