"""Approvals: a human decision parks a run (DESIGN.md 3, invariants 4 and 5)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.redaction import redact_fields
from approvals.conf import conf


class ApprovalKind(models.TextChoices):
    APPROVAL = "approval"
    RECONCILIATION = "reconciliation"
    # a run handed its request over to a person (a `handover=True` tool): picked up and closed
    HANDOVER = "handover"
    # the agent asked a person a question (`ask_human`, or any call deferred as a question):
    # answered with text (or one of the choices), which the model gets as the call's result
    QUESTION = "question"


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
    # what the agent is told (and may pass on to the customer): a rejection's reason
    reason = models.TextField(blank=True, default="")
    # the decider's note for staff only: the audit trail (the item, its history, the run page,
    # the API), never the agent's conversation, the run's events or anything the customer gets
    internal_note = models.TextField(blank=True, default="", db_default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # earlier decisions on this step, oldest first: the row (one per step) is reused when an
    # approved call is interrupted and its outcome must be reconciled; who approved it stays here
    history = models.JSONField(default=list, blank=True)
    # "I'm on it": who took the item and when; the claim lapses AGENTRUNS_CLAIM_SECONDS later
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    # past `due_at` a pending item escalates, once: the sweeper stamps `escalated_at`
    due_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # the two-person rule (approvals/domain/outcomes.py): approved when `approvals_required` distinct
    # people approved the same arguments; an edit starts a new `round` (the count starts again
    # from the editor); `approvals_given` counts this round's approvals (one ApprovalDecision each)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    approvals_given = models.PositiveSmallIntegerField(default=0)
    round = models.PositiveSmallIntegerField(default=1)
    # the proposal's version: 1 when the item opens, one more on every approval given (an edit
    # is one). Every door's decision names the version it was made on, and a decision on an older
    # one changes nothing (approvals/domain/outcomes.py `check_open`)
    version = models.PositiveIntegerField(default=1)
    # the call's operation key (its tool's `operation_key=` of the current proposal; "" for
    # none): the card shows the key's state and the other pending items of the same key
    operation_key = models.CharField(max_length=200, blank=True, default="")
    # its run's priority when it opened: the inbox lists the highest first, then the newest
    priority = models.SmallIntegerField(default=0, db_default=0)
    # a question: the token of the run's wait the answer resolves, and the answer given
    wait_token = models.CharField(max_length=64, blank=True, default="", db_default="")
    answer = models.TextField(blank=True, default="", db_default="")

    class Meta:
        ordering = ["-priority", "-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["operation_key"],
                condition=Q(status="pending") & ~Q(operation_key=""),
                name="approval_pending_key_idx",
            ),
            # the inbox and the API list: by status, the highest priority first, then the newest
            models.Index(
                fields=["status", "-priority", "-created_at", "-id"],
                name="approval_status_priority_idx",
            ),
            models.Index(
                fields=["expires_at"],
                condition=Q(status="pending", expires_at__isnull=False),
                name="approval_expiry_idx",
            ),
            # the sweeper's escalation scan: pending items that have not escalated yet
            models.Index(
                fields=["due_at"],
                condition=Q(status="pending", due_at__isnull=False, escalated_at__isnull=True),
                name="approval_due_idx",
            ),
            # the inbox's decided view: the newest decision first (approvals/domain/history.py)
            models.Index(
                fields=["-decided_at", "-id"],
                condition=Q(decided_at__isnull=False),
                name="approval_decided_idx",
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

    def visible_args(self) -> dict:
        """The requested arguments as a person may see them (the tool's secrets masked)."""
        return redact_fields(self.requested_args, self.hidden_fields)

    def redacted(self, args: object) -> object:
        """Any arguments of this call (edited, approved, an earlier round's) as people see them."""
        return redact_fields(args, self.hidden_fields)

    @property
    def question(self) -> str:
        """A question's text ("" for other kinds)."""
        return str(self.requested_args.get("question") or "") if self.kind == "question" else ""

    @property
    def choices(self) -> list[str] | None:
        """A question's choices (None: any answer, or not a question)."""
        choices = self.requested_args.get("choices") if self.kind == "question" else None
        return [str(c) for c in choices] if isinstance(choices, list) and choices else None

    @property
    def decided_by_name(self) -> str | None:
        return actor_name(self.decided_by)

    def current_approvals(self) -> list[ApprovalDecision]:
        """This round's approvals, oldest first (from a prefetch when the caller made one)."""
        return [
            d
            for d in self.decisions.all()
            if d.decision == DecisionKind.APPROVE and d.round == self.round
        ]

    @property
    def amount_cents(self) -> int | None:
        """The proposal's `amount_cents` when it is an integer (not a bool), else None."""
        amount = self.effective_args.get("amount_cents")
        return amount if isinstance(amount, int) and not isinstance(amount, bool) else None

    # ---------------------------------------------------------------- claims and due times
    @property
    def claim_expires_at(self) -> datetime | None:
        if self.claimed_at is None:
            return None
        return self.claimed_at + timedelta(seconds=conf.CLAIM_SECONDS)

    def claimant(self, now: datetime | None = None):
        """Who holds the item right now (None: nobody, the claim lapsed, or it is decided)."""
        if self.status != ApprovalStatus.PENDING or self.claimed_by_id is None:
            return None
        expires = self.claim_expires_at
        if expires is None or expires <= (now or timezone.now()):
            return None
        return self.claimed_by

    @property
    def is_overdue(self) -> bool:
        return (
            self.status == ApprovalStatus.PENDING
            and self.due_at is not None
            and self.due_at <= timezone.now()
        )

    @property
    def is_multi(self) -> bool:
        """More than one approver needed: the run's starter may not approve it."""
        return self.approvals_required > 1


class DecisionKind(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"
    CLOSE = "close"  # a hand-over done with
    ANSWER = "answer"  # a question answered


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
    # approve: the tool's `amount_arg` in what was approved (an approver's total per day)
    amount = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    internal_note = models.TextField(blank=True, default="", db_default="")  # staff only
    decided_at = models.DateTimeField()

    class Meta:
        ordering = ["approval", "decided_at", "id"]
        # an approver's approvals of a day (AGENTRUNS_APPROVER_DAILY_LIMIT_CENTS)
        indexes = [
            models.Index(
                fields=["user", "decided_at"],
                condition=Q(decision="approve"),
                name="decision_user_day_idx",
            )
        ]
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


# ------------------------------------------------------------------ notifications (outbox)
class WebhookEndpoint(models.Model):
    """A receiver of signed webhooks, configured in the admin (the one of AGENTRUNS_WEBHOOK_URL
    needs no row: a delivery with no endpoint goes there)."""

    url = models.URLField(max_length=500)
    # `whsec_<base64>` (Standard Webhooks); never shown again after it is set
    secret = models.CharField(max_length=300)
    # the event types it receives; empty: all of them
    event_types = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True, default="")
    # why delivery stopped by itself (the receiver answered 410 Gone)
    disabled_reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.description or self.url

    def wants(self, event_type: str) -> bool:
        return self.active and (not self.event_types or event_type in self.event_types)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookDelivery(models.Model):
    """One event for one endpoint, written in the transaction of the change it reports, and
    sent (at least once) by the worker's delivery loop. `body` is the exact JSON that is signed
    and sent on every try, always with the same `webhook_id`."""

    webhook_id = models.CharField(max_length=64, db_index=True)
    event_type = models.CharField(max_length=40)
    body = models.TextField()
    # None: the endpoint of AGENTRUNS_WEBHOOK_URL
    endpoint = models.ForeignKey(
        WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    run_id = models.UUIDField(null=True, blank=True, db_index=True)
    approval_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # the worker sending it right now; an expired lease (the worker died) is taken over
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_response = models.TextField(blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    # one entry per try: {"at", "status", "error", "ms", "by"} (the last 50)
    attempt_log = models.JSONField(default=list, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="delivery_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.webhook_id} ({self.status})"


class MailNotice(models.Model):
    """An item somebody should hear about by email; the mailer sends what accumulated as one
    mail per person (written with the change, like a webhook delivery)."""

    class Kind(models.TextChoices):
        REQUESTED = "requested"
        ESCALATED = "escalated"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["created_at"], condition=Q(sent_at__isnull=True), name="mail_unsent_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.approval_id}"
