"""Email about items, batched: one mail per person for everything that accumulated.

A notice is written with the change (an item opened or escalated). The mailer waits until the
oldest unsent notice is AGENTRUNS_EMAIL_BATCH_SECONDS old, then takes every unsent notice at
once: 50 new items make one mail per person, not 50. New items go to everyone who may decide;
escalated ones to AGENTRUNS_ESCALATION_GROUP (or the superusers). Items decided meanwhile are
left out. Sent through Django's email backend (console for `make run`, SMTP by settings), at
least once: notices are leased like webhook deliveries and marked sent after the send.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone

from agentruns.runtime.values.money import format_cents
from agentruns.selectors.people import email_lookup
from approvals.conf import conf
from approvals.models import Approval, ApprovalStatus, MailNotice
from approvals.notifications.outbox import approval_url, inbox_url

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=5)
MAX_NOTICES = 1000  # per pass; more wait for the next one
LISTED = 25  # items named in one mail; the rest are counted


def deciders() -> list:
    """Active users with an address who may decide items (the permission, or superusers)."""
    perm = Permission.objects.filter(
        content_type__app_label="approvals", codename="decide_approval"
    ).first()
    may = Q(is_superuser=True)
    if perm is not None:
        may |= Q(user_permissions=perm) | Q(groups__permissions=perm)
    users = get_user_model().objects.filter(may, is_active=True).exclude(**{email_lookup(): ""})
    return list(users.distinct().order_by("id"))


def escalation_recipients() -> list:
    users = get_user_model().objects.filter(is_active=True).exclude(**{email_lookup(): ""})
    if conf.ESCALATION_GROUP:
        users = users.filter(groups__name=conf.ESCALATION_GROUP)
    else:
        users = users.filter(is_superuser=True)
    return list(users.distinct().order_by("id"))


def _claim(owner: str, now: datetime) -> list[MailNotice]:
    free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
    unsent = MailNotice.objects.filter(free, sent_at__isnull=True)
    oldest = unsent.order_by("created_at").values_list("created_at", flat=True).first()
    if oldest is None or oldest > now - timedelta(seconds=conf.EMAIL_BATCH_SECONDS):
        return []
    with transaction.atomic():
        notices = list(unsent.select_for_update(skip_locked=True).order_by("id")[:MAX_NOTICES])
        MailNotice.objects.filter(id__in=[n.id for n in notices]).update(
            lease_owner=owner, lease_expires_at=now + LEASE
        )
    return notices


def _subject(new: int, escalated: int) -> str:
    parts = []
    if escalated:
        parts.append(f"{escalated} overdue")
    if new:
        parts.append(f"{new} new")
    noun = "item needs" if new + escalated == 1 else "items need"
    return f"[Agent runs] {' and '.join(parts)} {noun} a decision"


def send_due_digests(owner: str, now: datetime | None = None) -> int:
    """One pass of the mailer. Returns how many mails went out."""
    now = now or timezone.now()
    notices = _claim(owner, now)
    if not notices:
        return 0
    pending = {
        a.id: a
        for a in Approval.objects.select_related("run").filter(
            id__in={n.approval_id for n in notices}, status=ApprovalStatus.PENDING
        )
    }
    # person -> kind -> items (each item once per kind)
    wanted: dict[int, dict[str, dict[int, Approval]]] = defaultdict(lambda: defaultdict(dict))
    people: dict[int, object] = {}
    audiences: dict[str, list | None] = {kind: None for kind in MailNotice.Kind.values}
    for notice in notices:
        approval = pending.get(notice.approval_id)
        if approval is None:
            continue  # decided (or withdrawn) before the mail went out
        if audiences[notice.kind] is None:
            audiences[notice.kind] = (
                deciders() if notice.kind == MailNotice.Kind.REQUESTED else escalation_recipients()
            )
        for person in audiences[notice.kind]:
            people[person.id] = person
            wanted[person.id][notice.kind][approval.id] = approval
    messages = []
    for person_id, kinds in wanted.items():
        person = people[person_id]
        new = list(kinds.get(MailNotice.Kind.REQUESTED, {}).values())
        escalated = list(kinds.get(MailNotice.Kind.ESCALATED, {}).values())
        context = {
            "person": person,
            "new": [_line(a) for a in new[:LISTED]],
            "new_more": max(0, len(new) - LISTED),
            "escalated": [_line(a) for a in escalated[:LISTED]],
            "escalated_more": max(0, len(escalated) - LISTED),
            "inbox_url": inbox_url(),
        }
        messages.append(
            EmailMessage(
                subject=_subject(len(new), len(escalated)),
                body=render_to_string("approvals/email/digest.txt", context),
                to=[getattr(person, email_lookup())],
            )
        )
    if messages:
        get_connection().send_messages(messages)
    MailNotice.objects.filter(id__in=[n.id for n in notices], lease_owner=owner).update(
        sent_at=timezone.now(), lease_owner="", lease_expires_at=None
    )
    if messages:
        log.info("mailer: %d mail(s) about %d item(s)", len(messages), len(pending))
    return len(messages)


def _line(approval: Approval) -> dict:
    amount = approval.amount_cents
    return {
        "id": approval.id,
        "tool": approval.tool,
        "agent": approval.agent,
        "kind": approval.kind,
        "amount": format_cents(amount) if amount is not None else "",
        "order_id": approval.effective_args.get("order_id", ""),
        "waiting_since": approval.created_at,
        "url": approval_url(approval.id),
    }
