"""What the inbox's page reads (issue 44: the desk's pages at scale): the decision rows only of
the items that need more than one approver (their cards list this round's approvals), in one
query however many; the overdue items only when the capped count found some."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approval, ApprovalDecision

from .kit import bulk_pending, login

pytestmark = pytest.mark.django_db

INBOX = "/approvals/"


def inbox(client: Client) -> tuple[str, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(INBOX)
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in ctx.captured_queries]


def two_person(items: list[Approval], approver) -> None:
    """Each item needs two approvers, one of whom (`approver`) has approved."""
    Approval.objects.filter(id__in=[a.id for a in items]).update(
        approvals_required=2, approvals_given=1
    )
    ApprovalDecision.objects.bulk_create(
        ApprovalDecision(
            approval=item,
            user=approver,
            username=approver.username,
            decision="approve",
            round=1,
            args=item.requested_args,
            decided_at=timezone.now(),
        )
        for item in items
    )


def decision_reads(queries: list[str]) -> int:
    return sum('FROM "approvals_approvaldecision"' in sql for sql in queries)


def test_decisions_are_read_once_for_the_cards_that_list_them(approver):
    other = get_user_model().objects.create_user("other-approver")
    client = login(Client(), approver)
    bulk_pending(5)
    _, plain = inbox(client)
    assert decision_reads(plain) == 0  # no card lists approvals: nothing to read
    two_person(bulk_pending(2), other)
    html, few = inbox(client)
    assert decision_reads(few) == 1
    assert html.count('approved by <strong class="approver">other-approver</strong>') == 2
    two_person(bulk_pending(10), other)
    html, many = inbox(client)
    assert decision_reads(many) == 1 and len(many) == len(few)
    assert html.count('approved by <strong class="approver">other-approver</strong>') == 12


def test_overdue_items_are_read_when_the_count_found_some(approver):
    client = login(Client(), approver)
    items = bulk_pending(4)
    html, none_late = inbox(client)
    assert "overdue-items" not in html
    Approval.objects.filter(id=items[0].id).update(due_at=timezone.now() - timedelta(minutes=5))
    html, late = inbox(client)
    assert len(late) == len(none_late) + 1  # the overdue list, pinned above the page
    order = [int(i) for i in re.findall(r'<article class="card [^"]*" id="approval-(\d+)"', html)]
    assert order[0] == items[0].id and sorted(order) == sorted(a.id for a in items)
