"""The sweeper re-rings runs whose lease expired, once, and leaves live and parked runs alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import Run
from agentruns.runtime.workers.sweeper import sweep
from tests.helpers import advance, script_run

pytestmark = pytest.mark.django_db


def test_sweeper_reenqueues_expired_lease_and_run_continues():
    run = script_run([{"calls": [["t_echo", {"text": "x"}]]}, {"text": "ok"}])
    past = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(id=run.id).update(
        status="running", lease_owner="dead:1", lease_expires_at=past, enqueued_at=past
    )
    before = OrmQ.objects.count()
    assert sweep() == 1
    assert OrmQ.objects.count() == before + 1
    assert sweep() == 0  # rung once, not on every pass
    run = advance(run)
    assert run.status == "succeeded"


def test_sweeper_ignores_live_leases_and_parked_runs():
    run = script_run([{"text": "x"}])
    past = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(id=run.id).update(
        status="running",
        lease_owner="alive:1",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        enqueued_at=past,
    )
    other = script_run([{"text": "y"}])
    Run.objects.filter(id=other.id).update(status="waiting", enqueued_at=past)
    assert sweep() == 0
