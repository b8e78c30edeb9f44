"""Audit: every decision is visible on the run's timeline and in the admin."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals import services

from .kit import SECRET, login, parked_approval, unknown_step_approval

pytestmark = pytest.mark.django_db


def test_decision_is_on_the_run_page_timeline(client, approver, lead):
    approval = parked_approval(amount=4599)
    services.approve(
        approval.id, user=approver, edited_args={"amount_cents": 2500}, reason="only the lid"
    )
    html = login(client, lead).get(reverse("run-detail", args=[approval.run_id])).content.decode()
    assert "approved" in html and "approver" in html
    assert "amount_cents 4599 → 2500" in html  # the diff, as the timeline renders it
    # (the secret itself is in this test agent's scripted *input*, which the run page shows)


def test_admin_lists_and_shows_decisions_read_only(client, approver, lead):
    approved = parked_approval(amount=4599)
    services.approve(
        approved.id, user=approver, edited_args={"amount_cents": 2500}, reason="only the lid"
    )
    rejected = parked_approval()
    services.reject(rejected.id, user=approver, reason="fraud")
    resolved = unknown_step_approval()
    services.reconcile(
        resolved.id, user=approver, resolution="happened", result={"checked": "mail log"}
    )
    login(client, lead)
    listing = client.get(reverse("admin:approvals_approval_changelist"))
    assert listing.status_code == 200
    text = listing.content.decode()
    assert "25.00" in text and "approver" in text
    detail = client.get(
        reverse("admin:approvals_approval_change", args=[approved.id])
    ).content.decode()
    assert (
        "only the lid" in detail
        and "amount_cents" in detail
        and "4599" in detail
        and "2500" in detail
    )
    assert SECRET not in detail
    assert (
        "mail log"
        in client.get(
            reverse("admin:approvals_approval_change", args=[resolved.id])
        ).content.decode()
    )
    assert (
        "fraud"
        in client.get(
            reverse("admin:approvals_approval_change", args=[rejected.id])
        ).content.decode()
    )
    # the audit cannot be edited or deleted from the admin
    response = client.post(
        reverse("admin:approvals_approval_delete", args=[approved.id]), {"post": "yes"}
    )
    assert response.status_code == 403
