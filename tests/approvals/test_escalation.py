"""Due times and escalation: the setting and a tool's own `escalate_after`, exactly one
escalation per item however many sweepers race, and the inbox leading with overdue items."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentruns.models import RunEvent
from agentruns.registry import Agent, ToolContext, register_agent, tool
from agentruns.runtime.workers.sweeper import sweep
from agentruns.services import start_run
from approvals import services
from approvals.domain.escalation import escalate_due_approvals
from approvals.models import Approval, MailNotice, WebhookDelivery
from approvals.notifications.signing import new_secret
from tests.approvals.kit import bulk_pending, login, parked_approval
from tests.conftest import ApiClient
from tests.helpers import advance, race
from tests.testkit import script_policy

pytestmark = pytest.mark.django_db


@tool(side_effect=True, requires_approval=True, escalate_after=0)
def esc_never(ctx: ToolContext, note: str) -> dict:
    """Needs approval, never escalates whatever the default."""
    return {"ok": note}


@tool(side_effect=True, requires_approval=True, escalate_after=30)
def esc_soon(ctx: ToolContext, note: str) -> dict:
    """Needs approval, escalates after 30 s whatever the default."""
    return {"ok": note}


register_agent(
    Agent(
        name="esc-script",
        instructions="Follow the script.",
        tools=["esc_never", "esc_soon"],
        scripted_policy=script_policy,
    )
)


def parked_on(tool_name: str) -> Approval:
    run = start_run("esc-script", {"script": [{"calls": [[tool_name, {"note": "x"}]]}]}).run
    advance(run)
    return Approval.objects.get(run=run)


@pytest.fixture
def hook(settings):
    settings.AGENTRUNS_WEBHOOK_URL = "http://127.0.0.1:9/hooks"
    settings.AGENTRUNS_WEBHOOK_SECRET = new_secret()


def test_due_time_from_the_setting_or_the_tools_own(settings):
    settings.AGENTRUNS_APPROVAL_ESCALATE_SECONDS = 3600
    before = timezone.now()
    approval = parked_approval()
    assert timedelta(seconds=3590) < approval.due_at - before < timedelta(seconds=3610)
    assert parked_on("esc_never").due_at is None
    soon = parked_on("esc_soon")
    assert soon.due_at - soon.created_at < timedelta(seconds=31)
    settings.AGENTRUNS_APPROVAL_ESCALATE_SECONDS = 0
    assert parked_approval().due_at is None  # 0: off


def test_an_overdue_item_escalates_once_with_its_event_webhook_and_mail(hook, settings):
    settings.AGENTRUNS_APPROVAL_ESCALATE_SECONDS = 60
    approval = parked_approval()
    later = timezone.now() + timedelta(seconds=61)
    assert escalate_due_approvals() == 0  # not due yet
    assert escalate_due_approvals(later) == 1
    assert escalate_due_approvals(later) == 0
    sweep(later)  # the sweeper's pass does it too, and finds nothing left
    approval.refresh_from_db()
    assert approval.escalated_at is not None
    events = RunEvent.objects.filter(run_id=approval.run_id, type="approval.escalated")
    assert [e.data["approval"] for e in events] == [approval.id]
    (row,) = WebhookDelivery.objects.filter(event_type="approval.escalated")
    body = json.loads(row.body)
    assert body["data"]["approval"]["id"] == approval.id
    assert body["data"]["approval"]["escalated_at"] is not None
    assert MailNotice.objects.filter(approval=approval, kind="escalated").count() == 1


def test_a_decided_item_never_escalates(approver, settings):
    settings.AGENTRUNS_APPROVAL_ESCALATE_SECONDS = 1
    approval = parked_approval()
    services.approve(approval.id, user=approver)
    assert escalate_due_approvals(timezone.now() + timedelta(seconds=5)) == 0


@pytest.mark.django_db(transaction=True)
def test_racing_sweepers_escalate_each_item_exactly_once(hook):
    items = bulk_pending(12)
    Approval.objects.filter(id__in=[a.id for a in items]).update(
        due_at=timezone.now() - timedelta(seconds=1)
    )
    counts = race(*[escalate_due_approvals] * 3)
    assert sum(counts) == 12, counts
    for approval in items:
        assert (
            RunEvent.objects.filter(run_id=approval.run_id, type="approval.escalated").count() == 1
        )
        assert (
            WebhookDelivery.objects.filter(
                approval_id=approval.id, event_type="approval.escalated"
            ).count()
            == 1
        )


def test_the_inbox_leads_with_overdue_items_and_marks_them(approver):
    items = bulk_pending(5)
    late, later = items[0], items[1]  # the oldest two, due first
    now = timezone.now()
    Approval.objects.filter(id=late.id).update(due_at=now - timedelta(minutes=10), escalated_at=now)
    Approval.objects.filter(id=later.id).update(due_at=now - timedelta(minutes=5))
    Approval.objects.filter(id=items[4].id).update(due_at=now + timedelta(hours=1))
    html = login(Client(), approver).get("/approvals/").content.decode()
    order = [int(chunk.split('"')[0]) for chunk in html.split('id="approval-')[1:]]
    assert order[:2] == [late.id, later.id]  # most overdue first, above the newest
    assert order[2:] == [items[4].id, items[3].id, items[2].id]
    head = html.split(f'id="approval-{late.id}"')[1].split("</header>")[0]
    assert "overdue · escalated" in head
    assert "overdue" in html.split(f'id="approval-{later.id}"')[1].split("</header>")[0]
    only = login(Client(), approver).get("/approvals/?overdue=1").content.decode()
    assert only.count('class="card ') == 2
    row = ApiClient(approver).get("/api/approvals?status=pending").json()["approvals"]
    flags = {r["id"]: (r["overdue"], r["escalated_at"] is not None) for r in row}
    assert flags[late.id] == (True, True) and flags[later.id] == (True, False)
    assert flags[items[4].id] == (False, False)
