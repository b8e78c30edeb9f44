"""Email through Django's email backend, batched: 50 new items make one mail per person who may
decide; escalated items go to the escalation group; decided items are left out."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.utils import timezone

from approvals import services
from approvals.models import MailNotice
from approvals.notifications import outbox
from approvals.notifications.mail import send_due_digests
from tests.approvals.kit import bulk_pending, parked_approval
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

LATER = timedelta(seconds=61)  # past the default 60 s batch window


@pytest.fixture
def staff(django_user_model, approver, lead, viewer):
    for user in (approver, lead, viewer):
        user.email = f"{user.username}@example.com"
        user.save()
    deciders = Group.objects.create(name="deciders")
    deciders.permissions.add(*approver.user_permissions.all())
    grouped = make_user(django_user_model, "grouped")
    grouped.email = "grouped@example.com"
    grouped.groups.add(deciders)
    grouped.save()
    make_user(django_user_model, "no-address", ["approvals.decide_approval"])
    return {"approver": approver, "lead": lead, "viewer": viewer, "grouped": grouped}


def test_fifty_new_items_make_one_mail_per_person_who_may_decide(staff):
    first = parked_approval()  # opened by the engine: its notice is written with it
    assert MailNotice.objects.filter(approval=first, kind="requested").count() == 1
    for approval in bulk_pending(49):
        outbox.queue_mail(approval, MailNotice.Kind.REQUESTED)
    assert send_due_digests("mailer") == 0  # the batch window is still open
    assert mail.outbox == []
    assert send_due_digests("mailer", now=timezone.now() + LATER) == 3
    assert sorted(m.to[0] for m in mail.outbox) == [
        "approver@example.com",
        "grouped@example.com",
        "lead@example.com",
    ]  # not the viewer (may not decide), not the user without an address
    body = mail.outbox[0].body
    assert "50 new" in mail.outbox[0].subject
    assert f"/approvals/{first.id}/" in body and "and 25 more" in body
    assert not MailNotice.objects.filter(sent_at__isnull=True).exists()
    assert send_due_digests("mailer", now=timezone.now() + LATER) == 0  # sent once


def test_decided_items_are_left_out_and_escalations_go_to_the_group(staff, settings, approver):
    settings.AGENTRUNS_ESCALATION_GROUP = "leads"
    leads = Group.objects.create(name="leads")
    staff["viewer"].groups.add(leads)  # the group decides who hears of escalations
    decided, waiting = parked_approval(), parked_approval()
    services.approve(decided.id, user=approver)
    outbox.queue_mail(waiting, MailNotice.Kind.ESCALATED)
    send_due_digests("mailer", now=timezone.now() + LATER)
    by_person = {m.to[0]: m for m in mail.outbox}
    assert set(by_person) == {
        "approver@example.com",
        "grouped@example.com",
        "lead@example.com",
        "viewer@example.com",
    }
    assert f"/approvals/{decided.id}/" not in "".join(m.body for m in mail.outbox)
    assert "overdue" in by_person["viewer@example.com"].subject
    assert f"/approvals/{waiting.id}/" in by_person["viewer@example.com"].body
    assert "overdue" not in by_person["approver@example.com"].subject


def test_no_mail_when_turned_off(staff, settings):
    settings.AGENTRUNS_APPROVAL_EMAILS = False
    parked_approval()
    assert not MailNotice.objects.exists()


def test_odd_amounts_read_the_same_in_the_mail_and_the_admin(staff, client, lead):
    """One formatter: exact for a huge integer, and a bool (JSON true) is no amount."""
    huge, boolean, plain = bulk_pending(3)
    for approval, amount in ((huge, 10**22 + 7), (boolean, True), (plain, 459900)):
        approval.requested_args = {**approval.requested_args, "amount_cents": amount}
        approval.save(update_fields=["requested_args"])
        outbox.queue_mail(approval, MailNotice.Kind.REQUESTED)
    assert send_due_digests("mailer", now=timezone.now() + LATER) == 3
    body = mail.outbox[0].body
    assert "100,000,000,000,000,000,000.07" in body and "4,599.00" in body
    assert "0.01" not in body  # true is not one cent
    client.force_login(lead)
    page = client.get("/admin/approvals/approval/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "100,000,000,000,000,000,000.07" in html and "4,599.00" in html
    assert "0.01" not in html
