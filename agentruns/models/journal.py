"""What a run's agent loop waits for, and the other units it journals (DESIGN.md 4.11-4.12).

A run's model requests and tool calls are its Steps. Everything else the agent's own loop does
as a durable unit (tool discovery, an event handler, a capability's durable operation) is a
`JournalEntry`, found again on replay by its order in the run; a wait for something outside the
run (a decision in the inbox, an outside event resolving a token) is a `Wait`, by its order too.
"""

from __future__ import annotations

from django.db import models

from agentruns.models.runs import Run

# the name's start of a wait tool code made (`wait_for_event`, a timer): `tool:<step id>`, found
# by its step and its order within the call (runtime/waits/tools.py)
TOOL_WAIT = "tool:"


class WaitKind(models.TextChoices):
    APPROVAL = "approval"  # the inbox decides the calls' approvals (`calls`)
    EVENT = "event"  # something outside resolves the token (a hook, `resolve_wait`)
    TIMER = "timer"  # resolved at `due_at` by whichever process looks first (runtime/waits/due.py)
    QUESTION = "question"  # a person answers in the inbox (`ask_human`)
    MESSAGE = "message"  # the next message of the run's thread


class WaitStatus(models.TextChoices):
    PENDING = "pending"
    RESOLVED = "resolved"
    FAILED = "failed"  # failed by its resolver, or timed out


class Wait(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="waits", db_index=False)
    ordinal = models.PositiveIntegerField()  # the n-th wait of the run's loop
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=WaitKind.choices)
    # random, or chosen by the engineer for an outside event (`wait_for_event("carrier:123")`)
    token = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=WaitStatus.choices, default=WaitStatus.PENDING)
    # what `ask` returned (null: it handed the token on and the run waits for the resolution)
    asked = models.JSONField(null=True, blank=True)
    # an approval wait: the tool call ids; a question: its call (both found by call, not order)
    calls = models.JSONField(default=list, blank=True)
    payload = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)  # the wait's timeout
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["run", "ordinal"], name="wait_unique_run_ordinal"),
            # one live holder per token: a chosen token is waited on again once resolved
            models.UniqueConstraint(
                fields=["token"],
                condition=models.Q(status="pending"),
                name="wait_unique_pending_token",
            ),
        ]
        indexes = [
            models.Index(fields=["token"], name="wait_token_idx"),  # a hook's second try: 409
            # what waiting runs wait for (`waiting_for`, /metrics), without the resolved ones
            models.Index(
                fields=["kind", "created_at"],
                condition=models.Q(status="pending"),
                name="wait_pending_kind_idx",
            ),
            models.Index(
                fields=["due_at"],
                condition=models.Q(status="pending", due_at__isnull=False),
                name="wait_pending_due_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"wait {self.ordinal} {self.name} of {self.run_id} ({self.status})"


class JournalEntry(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="journal", db_index=False)
    ordinal = models.PositiveIntegerField()  # the n-th such unit of the run's loop
    name = models.CharField(max_length=300)  # the unit's persisted operation name
    # what the unit returned, as JSON text (byte for byte: replayed as it was)
    payload = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["run", "ordinal"], name="journal_unique_run_ordinal"),
        ]

    def __str__(self) -> str:
        return f"journal {self.ordinal} {self.name} of {self.run_id}"


class ResumePoint(models.Model):
    """Where a resumed slice of the run starts instead of replaying its history: the agent's
    messages just before one of its model requests (the model step they end after, the journal's
    counters then), written in the commit that ends a slice before the run ends
    (runtime/engine/resume.py). A slice that resumes from it replays only what came after; without
    one the run replays from its start."""

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="resume_point"
    )
    model_step = models.UUIDField()  # the model step whose answer `messages` goes on from
    models_seen = models.PositiveIntegerField()  # the model requests the loop had made before
    entries_seen = models.PositiveIntegerField()
    waits_seen = models.PositiveIntegerField()
    run_step = models.PositiveIntegerField(default=0)  # Pydantic AI's step number then
    # a thread's turn: its answer is appended to the thread when the loop returns
    thread_turn = models.BooleanField(default=False)
    messages = models.TextField()  # pydantic-ai's ModelMessagesTypeAdapter JSON
    usage = models.JSONField(default=dict)  # the run's RunUsage then
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"resume point of {self.run_id} after model request {self.models_seen}"


class HookReceipt(models.Model):
    """A signed hook request's `webhook-id`, kept while its signature would still verify (a
    few minutes): a second request with the id, to any token, is a replay and refused (the
    signature covers the id, timestamp and body, not the token in the URL)."""

    webhook_id = models.CharField(max_length=200, primary_key=True)
    token = models.CharField(max_length=200)
    received_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"hook receipt {self.webhook_id}"
