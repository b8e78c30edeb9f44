"""Runs, their steps, attempts and events: the persisted truth of the runtime (DESIGN.md 3).

Run status changes are written in `agentruns.runtime.execution.transitions` (fields + events, applied by the
executor's fenced commit or by `transitions.apply`); these classes hold the data, the policy
lookups on it and the small step changes that need no event of their own.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
# a run's priority: higher is claimed first (the API's and the chat's `priority`, default 0)
PRIORITY_MIN, PRIORITY_MAX = -100, 100


class StepKind(models.TextChoices):
    MODEL = "model"
    TOOL = "tool"


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"


TERMINAL_STEP_STATUSES = (
    StepStatus.SUCCEEDED,
    StepStatus.FAILED,
    StepStatus.REJECTED,
    StepStatus.SKIPPED,
)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    dedupe_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    # whose key `dedupe_key` is (its starter's pk as text, "" for the system): a key names a
    # run only for the one who chose it, so another user's same key is their own run
    dedupe_owner = models.CharField(max_length=64, blank=True, default="", db_default="")
    model = models.CharField(max_length=200, blank=True, default="")
    # the tools (name -> policy) the run may call, frozen at start
    tool_snapshot = models.JSONField(default=dict)
    # who started it, their groups, and per tool: allowed, approval rule, approvers' limits;
    # frozen at start by `runtime.permissions.snapshot` (retry and resume keep it)
    permissions = models.JSONField(default=dict, blank=True)
    # what a retry of the failed run does with a step whose outcome is unknown and that nobody
    # settled (runtime/execution/unknown_outcomes.py): "refuse" (the default) or "skip", as the
    # agent declares it (`Agent(retry_unknown=...)`), frozen at start
    retry_unknown = models.CharField(max_length=8, default="refuse", db_default="refuse")
    max_steps = models.PositiveIntegerField(default=25)
    token_budget = models.PositiveIntegerField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)

    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # when the sweeper (or a service) last rang the doorbell; stops re-enqueue storms
    enqueued_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # higher is claimed first among queued runs (the API's and the chat's `priority`)
    priority = models.SmallIntegerField(default=0, db_default=0)
    # the agent's concurrency key for this run's input (NULL: none), fixed at start; runs of one
    # agent sharing it take at most the agent's limit of places (runtime/dispatch/concurrency.py)
    concurrency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # what the run is about (its agent's `scope` of its input, registry/run_input/scopes.py),
    # frozen at start: a tool's `scope_arg` must equal it (runtime/access/scope.py); NULL: not
    # bound
    scope = models.JSONField(null=True, blank=True)
    # it counts against its key's limit (admitted, and not a waiting run that let its place go)
    holds_key = models.BooleanField(default=False, db_default=False)
    # queued but not admitted: the run it waits behind in its key's line, or in its thread's
    # line (claims skip it)
    waiting_behind = models.UUIDField(null=True, blank=True)
    # the conversation it is a turn of (models/threads.py): one run of a thread at a time, in
    # a line of the thread's own beside its agent's key (runtime/dispatch/thread_line.py)
    thread = models.ForeignKey(
        "Thread",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="runs",
        db_index=False,
    )

    step_count = models.PositiveIntegerField(default=0)
    # last allocated RunEvent.seq; bumped with UPDATE ... RETURNING so seq has no holes
    last_seq = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0)

    output = models.TextField(blank=True, default="")
    # a structured output (the agent's `output_type` is not text): the validated object as JSON;
    # `output` then holds its JSON text
    output_data = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    stop_reason = models.CharField(max_length=200, blank=True, default="")
    # what the run's work came to, set when it ends by its agent's declaration ("refunded",
    # "refund_rejected", "handed_over"; "" for none): agentruns/registry/outcomes/
    outcome = models.CharField(max_length=40, blank=True, default="", db_default="")
    # denormalised search keys (order id, ticket id) for the runs list
    search_text = models.CharField(max_length=200, blank=True, default="")
    # the run's OpenTelemetry trace (runtime/tracing.py): chosen at start, the caller's when it
    # sent a W3C `traceparent` (kept as sent, so the run's root span continues the caller's)
    trace_id = models.CharField(max_length=32, blank=True, default="", db_default="")
    trace_parent = models.CharField(max_length=55, blank=True, default="", db_default="")

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "dedupe_owner", "dedupe_key"],
                condition=Q(dedupe_key__isnull=False),
                name="run_unique_owner_dedupe_key",
            ),
        ]
        indexes = [
            # the sweeper: the (few) live runs. Not on lease_expires_at: every engine commit renews
            # the lease, and an indexed column there would make each of those updates non-HOT,
            # rewriting every index of the table (with fillfactor 70 they stay HOT)
            models.Index(
                fields=["status"],
                condition=Q(status__in=["queued", "running"]),
                name="run_live_idx",
            ),
            # the claim: admitted queued runs, highest priority first, then the oldest doorbell
            models.Index(
                fields=["-priority", "enqueued_at", "id"],
                condition=Q(status="queued", waiting_behind__isnull=True),
                name="run_claim_idx",
            ),
            # a concurrency key's line: the runs holding it and those waiting for it, in start
            # order (only those rows: a finished run leaves the index)
            models.Index(
                fields=["agent", "concurrency_key", "created_at", "id"],
                condition=Q(holds_key=True) | Q(waiting_behind__isnull=False),
                name="run_key_line_idx",
            ),
            # a thread's runs, in start order (its line: the runs of it that have not ended)
            models.Index(
                fields=["thread", "created_at", "id"],
                condition=Q(thread__isnull=False),
                name="run_thread_idx",
            ),
            # the runs list: newest first, optionally by status / agent
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_created_idx"),
            # the runs list's outcome filter (only ended runs have one)
            models.Index(
                fields=["outcome", "-created_at"],
                condition=~Q(outcome=""),
                name="run_outcome_created_idx",
            ),
            # no plain index on search_text: the list searches it with istartswith / icontains,
            # which the trigram index on UPPER(search_text) serves (migration 0002); a btree on
            # the raw column served no query and cost every run's insert and final update
        ]
        permissions = [
            ("operate_run", "Can retry, cancel and resolve runs"),
            ("start_run", "Can start runs (the form, the API, fork, chat)"),
            ("resolve_hook", "Can resume runs waiting on a hook (POST /api/hooks/<token>)"),
            ("set_priority", "Can start runs with a priority above the default"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} run {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def worker(self) -> str:
        """The worker process executing the run ("host:pid"), "" when nobody holds its lease."""
        if not self.lease_owner or self.status != RunStatus.RUNNING:
            return ""
        return self.lease_owner.rsplit(":", 1)[0]  # the owner is host:pid:<executor tag>

    def tool_policy(self, tool: str) -> dict:
        """A tool's policy as frozen in the run's snapshot at start (not the current code's)."""
        return (self.tool_snapshot.get(tool) or {}) if tool else {}

    def redacted_fields(self, tool: str) -> list[str]:
        """The argument and result keys of `tool` that people never see (by the snapshot)."""
        return list(self.tool_policy(tool).get("redact", []))

    def tool_permission(self, tool: str) -> dict:
        """What the permission snapshot says about `tool` ({} for runs from before snapshots,
        which had every tool of their agent as the tool declares it)."""
        return ((self.permissions or {}).get("tools") or {}).get(tool) or {}

    def tool_allowed(self, tool: str) -> bool:
        return tool in self.tool_snapshot and self.tool_permission(tool).get("allowed", True)

    @property
    def allowed_tools(self) -> list[str]:
        """The tools the model is offered (the tool snapshot's, as far as permissions allow)."""
        return [name for name in self.tool_snapshot if self.tool_allowed(name)]


class Step(models.Model):
    # created (pending) before the step runs and never regenerated
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # no separate index: the (run, index) unique constraint serves every lookup by run
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=StepKind.choices)
    tool = models.CharField(max_length=100, blank=True, default="")
    # the model's id for this tool call, so the conversation can be rebuilt exactly
    call_id = models.CharField(max_length=100, blank=True, default="")
    arguments = models.JSONField(default=dict, blank=True)
    # stable for the step's whole life: every attempt sends the same key. Unique through a
    # constraint in Meta, not `unique=True`: on PostgreSQL that also builds a second,
    # varchar_pattern_ops index for LIKE, which no query uses and every step insert paid for
    idempotency_key = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    # a human approved this call (possibly with edited arguments); the engine may now execute it
    approved = models.BooleanField(default=False)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    # attempts made before the last manual retry: the tool's retry budget counts from here
    retry_base = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # model steps: what the model said and asked for
    text = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # what the agent's loop replays for this unit on resume (Pydantic AI's JSON codec, as JSON
    # text: byte for byte what the unit returned, key order included): a model step's
    # ModelResponse, a tool step's CallToolResult (None: derived from the fields above)
    payload = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL: none recorded
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="step_unique_run_index"),
            models.UniqueConstraint(fields=["idempotency_key"], name="step_unique_idempotency_key"),
        ]
        indexes = [models.Index(fields=["status", "kind"], name="step_status_kind_idx")]

    def __str__(self) -> str:
        label = self.tool if self.kind == StepKind.TOOL else "model"
        return f"#{self.index} {label} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STEP_STATUSES

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None

    # what `reject` changes (written by agentruns.runtime.writer)
    REJECTED_FIELDS = ("status", "finished_at", "error", "result")

    def reject(self, reason: str) -> None:
        """A human said no: the model receives the reason as the tool's result."""
        self.status, self.finished_at, self.error = StepStatus.REJECTED, timezone.now(), reason
        self.result = {"error": "rejected", "reason": reason}


class AttemptOutcome(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    CRASHED = "crashed"  # the worker died; found by the next lease holder
    UNKNOWN = "unknown"


class StepAttempt(models.Model):
    # (step, number) is unique and indexed: no second index to maintain on every attempt
    step = models.ForeignKey(
        Step, on_delete=models.CASCADE, related_name="attempt_rows", db_index=False
    )
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.RUNNING
    )
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["step", "number"]
        constraints = [
            models.UniqueConstraint(fields=["step", "number"], name="attempt_unique_step_number"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.step_id} ({self.outcome})"

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class RunEvent(models.Model):
    # (run, seq) is unique and indexed: no second index to maintain on every event
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_run_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"
