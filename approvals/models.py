"""Approvals: a human decision parks a run (DESIGN.md 3, invariants 4 and 5)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q


class ApprovalKind(models.TextChoices):
    APPROVAL = "approval"
    RECONCILIATION = "reconciliation"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    RESOLVED = "resolved"


class Approval(models.Model):
    step = models.OneToOneField("agentruns.Step", on_delete=models.CASCADE, related_name="approval")
    run = models.ForeignKey("agentruns.Run", on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(
        max_length=16, choices=ApprovalKind.choices, default=ApprovalKind.APPROVAL
    )
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    agent = models.CharField(max_length=100)
    tool = models.CharField(max_length=100)
    requested_args = models.JSONField(default=dict)
    edited_args = models.JSONField(null=True, blank=True)
    # reconciliation: what staff said happened ("happened", "retry", "abort") and any result
    resolution = models.CharField(max_length=16, blank=True, default="")
    resolution_result = models.JSONField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # earlier decisions on this step, oldest first: the row (one per step) is reused when an
    # approved call is interrupted and its outcome must be reconciled; who approved it stays here
    history = models.JSONField(default=list, blank=True)
    # the two-person rule (approvals/decisions.py): approved when `approvals_required` distinct
    # people approved the same arguments; an edit starts a new `round` (the count starts again
    # from the editor); `approvals_given` counts this round's approvals (one ApprovalDecision each)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    approvals_given = models.PositiveSmallIntegerField(default=0)
    round = models.PositiveSmallIntegerField(default=1)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="approval_status_created_idx"),
            models.Index(
                fields=["expires_at"],
                condition=Q(status="pending", expires_at__isnull=False),
                name="approval_expiry_idx",
            ),
        ]
        permissions = [("decide_approval", "Can approve, reject and reconcile")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} for {self.tool} ({self.status})"

    @property
    def earlier_approvals(self) -> list[dict]:
        """Earlier approval decisions on this step, `decided_at` as a datetime (for templates)."""
        out = []
        for entry in self.history:
            if entry.get("kind") == ApprovalKind.APPROVAL:
                at = entry.get("decided_at")
                out.append({**entry, "decided_at": datetime.fromisoformat(at) if at else None})
        return out

    @property
    def hidden_fields(self) -> list[str]:
        """Argument names the tool marks secret (from the run's snapshot, as it was at start)."""
        return self.run.redacted_fields(self.tool)

    @property
    def effective_args(self) -> dict:
        return self.edited_args if self.edited_args is not None else self.requested_args

    @property
    def is_multi(self) -> bool:
        """More than one approver needed: the run's starter may not approve it."""
        return self.approvals_required > 1


class DecisionKind(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class ApprovalDecision(models.Model):
    """One person's decision on an approval: who, when, which arguments (DESIGN.md 3)."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150)  # kept if the user is deleted
    decision = models.CharField(max_length=8, choices=DecisionKind.choices)
    round = models.PositiveSmallIntegerField()
    # approve: the full arguments this person approved (not redacted: they are what runs)
    args = models.JSONField(null=True, blank=True)
    edited = models.BooleanField(default=False)  # changed the arguments (started a new round)
    reason = models.TextField(blank=True, default="")
    decided_at = models.DateTimeField()

    class Meta:
        ordering = ["approval", "decided_at", "id"]
        constraints = [
            # the same person never counts twice in a round (the database says so, too)
            models.UniqueConstraint(
                fields=["approval", "round", "user"],
                condition=Q(decision="approve"),
                name="decision_one_approval_per_user_round",
            )
        ]

    def __str__(self) -> str:
        return f"{self.username} {self.decision} #{self.approval_id} (round {self.round})"
