"""Reads for the inbox and the approvals API (constant queries per page)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from .models import Approval, ApprovalStatus

AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "older": None}


def approvals_query(status: str = ApprovalStatus.PENDING, kind: str = "", agent: str = "", age: str = "") -> QuerySet[Approval]:
    qs = Approval.objects.select_related("run", "step", "decided_by").order_by("-created_at", "-id")
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if agent:
        qs = qs.filter(agent=agent)
    now = timezone.now()
    if age == "1h":
        qs = qs.filter(created_at__gte=now - timedelta(hours=1))
    elif age == "24h":
        qs = qs.filter(created_at__gte=now - timedelta(days=1))
    elif age == "older":
        qs = qs.filter(created_at__lt=now - timedelta(days=1))
    return qs
