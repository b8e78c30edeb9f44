"""The durable executor (DESIGN.md section 4).

`RunExecutor(run_id).advance()` is the body of the `advance_run` task. It claims the run's lease
with one conditional UPDATE, then drives the run step by step until it finishes, parks for a
human, yields its time slice, or loses the lease. Every commit it makes is fenced on the lease
(`events.record(lease_owner=...)`), renews it, allocates the event seqs, and reads the cancel
flag, all in one UPDATE, so the per-step cost does not grow with the run's history.

Commits per step: a read-only tool runs and is recorded in one commit; a side-effect tool gets one
commit before the call (running + attempt, with the stable idempotency key already durable) and
one after (result). A model step is one commit plus one per streamed delta batch; the tool steps
it asks for are planned in that same commit.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import DataError, close_old_connections, connection, transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import failpoints
from .conversation import Conversation
from .events import LeaseLost, record, record_statement, recorded
from .models import (
    AttemptOutcome,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
)
from .providers import ModelError, ModelRequest, TextDelta, ToolCall, Usage, get_provider
from .registry import (
    Tool,
    ToolArgumentsError,
    ToolContext,
    UnknownAgent,
    UnknownTool,
    get_agent,
    get_tool,
)
from .rows import WriteBatch

log = logging.getLogger(__name__)

MODEL_MAX_ATTEMPTS = 3
MODEL_STEP_FIELDS = ["status", "text", "tool_calls", "prompt_tokens", "completion_tokens", "finished_at", "error"]
TOOL_RESULT_FIELDS = ["status", "result", "error", "attempts", "started_at", "finished_at", "next_attempt_at"]


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def step_key(run_id: uuid.UUID, step_id: uuid.UUID) -> str:
    """The idempotency key a step sends to the outside world, on every attempt."""
    return f"run-{run_id.hex[:12]}-step-{step_id.hex}"


@lru_cache(maxsize=8)
def parse_model_prices(spec: str) -> dict[str, tuple[Decimal, Decimal]]:
    """AGENTRUNS_MODEL_PRICES "gpt-4o-mini=0.15/0.60,..." -> {model: (prompt, completion) USD
    per million tokens}. A malformed entry is skipped with a warning, never a failed run."""
    prices: dict[str, tuple[Decimal, Decimal]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, pair = item.partition("=")
        prompt, _, completion = pair.partition("/")
        try:
            prices[name.strip()] = (Decimal(prompt.strip()), Decimal((completion or prompt).strip()))
        except InvalidOperation:
            log.warning("AGENTRUNS_MODEL_PRICES: ignoring malformed entry %r", item)
    return prices


def model_cost_usd(model: str, usage: Usage) -> Decimal:
    """What a model step cost by the price table; "openai/gpt-4o" matches "openai/gpt-4o" or
    "gpt-4o". Unpriced models cost 0."""
    prices = parse_model_prices(settings.AGENTRUNS_MODEL_PRICES or "")
    price = prices.get(model) or prices.get(model.split("/", 1)[-1])
    if price is None:
        return Decimal(0)
    cost = (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / Decimal(1_000_000)
    return cost.quantize(Decimal("0.000001"))


class Heartbeat(threading.Thread):
    """Extends the lease while a long step runs; every engine commit extends it as well."""

    def __init__(self, run_id: uuid.UUID, owner: str, ttl: float) -> None:
        super().__init__(name=f"lease-heartbeat-{run_id}", daemon=True)
        self.run_id, self.owner, self.ttl = run_id, owner, ttl
        self.stopped = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.ttl / 3):
                expires = timezone.now() + timedelta(seconds=self.ttl)
                held = Run.objects.filter(id=self.run_id, lease_owner=self.owner).update(
                    lease_expires_at=expires
                )
                if not held:
                    self.lost.set()
                    return
        except Exception:
            log.warning("lease heartbeat failed for run %s", self.run_id, exc_info=True)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()


class RunExecutor:
    def __init__(self, run_id: uuid.UUID | str, owner: str | None = None) -> None:
        self.run_id = uuid.UUID(str(run_id))
        self.owner = owner or worker_id()
        self.ttl = float(settings.AGENTRUNS_LEASE_TTL_SECONDS)
        self.cancel_requested = False
        self.heartbeat: Heartbeat | None = None

    # ---------------------------------------------------------------- lease
    def claim(self) -> bool:
        now = timezone.now()
        free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        lease = {"lease_owner": self.owner, "lease_expires_at": now + timedelta(seconds=self.ttl)}
        if connection.vendor == "postgresql" and not connection.in_atomic_block:
            # the common case in one round trip: queued -> running, lease, and its event
            sql, params = record_statement(
                self.run_id,
                [("run.status", {"status": RunStatus.RUNNING})],
                set_fields={"status": RunStatus.RUNNING, **lease},
                default_fields={"started_at": now},
                where=("status = %s AND (lease_expires_at IS NULL OR lease_expires_at < %s)",
                       [RunStatus.QUEUED, now]),
            )
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                rows = cursor.fetchall()
            if rows:
                _, self.cancel_requested = recorded(self.run_id, rows, None)
                return True
            return bool(
                Run.objects.filter(free, id=self.run_id, status=RunStatus.RUNNING).update(**lease)
            )
        with transaction.atomic():
            fresh = Run.objects.filter(free, id=self.run_id, status=RunStatus.QUEUED).update(
                status=RunStatus.RUNNING, started_at=Coalesce("started_at", Value(now)), **lease
            )
            if fresh:
                self.commit([("run.status", {"status": RunStatus.RUNNING})])
                return True
            return bool(
                Run.objects.filter(free, id=self.run_id, status=RunStatus.RUNNING).update(**lease)
            )

    def commit(
        self,
        events: list[tuple[str, dict]],
        *,
        release: bool = False,
        batch: WriteBatch | None = None,
        **run_changes: Any,
    ) -> int:
        """The fenced run UPDATE + events, after the writes in `batch`, as one transaction.

        With a batch on PostgreSQL outside any transaction this is one round trip, guarded by a
        row lock on the run that aborts everything if the lease is no longer ours."""
        set_fields = dict(run_changes.pop("set_fields", {}))
        if release:
            set_fields.update(lease_owner="", lease_expires_at=None)
        else:
            set_fields["lease_expires_at"] = timezone.now() + timedelta(seconds=self.ttl)
        changes = dict(lease_owner=self.owner, set_fields=set_fields, **run_changes)
        if batch is not None and batch.one_round_trip and events:
            try:
                rows = batch.run(record_statement(self.run_id, events, **changes), guard=self._lease_guard())
            except DataError as exc:
                if "division by zero" in str(exc):
                    raise LeaseLost(str(self.run_id)) from None
                raise
            last_seq, cancel = recorded(self.run_id, rows, self.owner)
        else:
            with transaction.atomic():
                if batch is not None:
                    batch.execute_each()
                last_seq, cancel = record(self.run_id, events, **changes)
        self.cancel_requested = cancel
        return last_seq

    def _lease_guard(self) -> tuple[str, list[Any]]:
        # locks the run row for the rest of the implicit transaction, or divides by zero
        return (
            f"SELECT 1 / count(*)::int FROM (SELECT 1 FROM {Run._meta.db_table} "
            "WHERE id = %s AND lease_owner = %s FOR NO KEY UPDATE) AS held",
            [self.run_id, self.owner],
        )

    def check_lease(self) -> None:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(str(self.run_id))

    # ---------------------------------------------------------------- main loop
    def advance(self) -> str:
        if not self.claim():
            return "busy"
        self.heartbeat = Heartbeat(self.run_id, self.owner, self.ttl)
        self.heartbeat.start()
        try:
            return self._drive()
        except LeaseLost:
            log.warning("run %s: lease lost, another worker continues", self.run_id)
            return "lease_lost"
        except _RunFailed as exc:
            with transaction.atomic():
                return self.finish(RunStatus.FAILED, error=str(exc))
        except Exception as exc:  # an engine bug must not leave a run stuck
            log.exception("run %s: engine error", self.run_id)
            close_old_connections()
            try:
                with transaction.atomic():
                    return self.finish(RunStatus.FAILED, error=f"internal error: {exc!r}")
            except LeaseLost:
                return "lease_lost"
        finally:
            self.heartbeat.stop()

    def _drive(self) -> str:
        self.run = Run.objects.get(id=self.run_id)
        self.cancel_requested = self.run.cancel_requested
        try:
            self.agent = get_agent(self.run.agent)
        except UnknownAgent as exc:
            with transaction.atomic():
                return self.finish(RunStatus.FAILED, error=str(exc))
        try:
            self.provider = get_provider(self.run.model or settings.AGENTRUNS_MODEL)
        except ModelError as exc:
            with transaction.atomic():
                return self.finish(RunStatus.FAILED, error=f"model error: {exc}")
        self.tool_schemas = [get_tool(name).schema() for name in self.run.tool_snapshot]
        # a brand-new run (no steps counted, only its created + running events) has no history
        # to read; anything else loads it once
        fresh = self.run.step_count == 0 and self.run.last_seq <= 2
        self.steps: list[Step] = (
            [] if fresh else list(Step.objects.filter(run_id=self.run_id).order_by("index"))
        )
        self.conversation = Conversation(self.agent, self.run)
        self.cursor = 0  # steps[:cursor] are terminal
        # side-effect steps whose "running + attempt" row went out in the model's commit
        self.begun_here: set[uuid.UUID] = set()
        slice_ends = time.monotonic() + float(settings.AGENTRUNS_SLICE_SECONDS)

        while True:
            self.check_lease()
            while self.cursor < len(self.steps) and self.steps[self.cursor].is_terminal:
                self.cursor += 1
            if self.cancel_requested:
                with transaction.atomic():
                    return self.finish(
                        RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request"
                    )
            if self.run.deadline_at and timezone.now() >= self.run.deadline_at:
                with transaction.atomic():
                    return self.finish(
                        RunStatus.FAILED, stop_reason="deadline", error="the run's deadline passed"
                    )
            if time.monotonic() >= slice_ends:
                return self.yield_slice()

            if self.cursor < len(self.steps):
                step = self.steps[self.cursor]
                if step.status in (StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN):
                    with transaction.atomic():
                        return self.park()
                if step.status == StepStatus.RUNNING and step.id not in self.begun_here:
                    outcome = self.recover(step)
                    if outcome:
                        return outcome
                    continue
                if step.kind == StepKind.MODEL:
                    outcome = self.model_turn(step)
                    if outcome:
                        return outcome
                else:
                    outcome = self.tool_step(step)
                    if outcome:
                        return outcome
                continue

            last = self.steps[-1] if self.steps else None
            if last is not None and last.kind == StepKind.MODEL and not last.tool_calls:
                with transaction.atomic():
                    return self.finish(RunStatus.SUCCEEDED, output=last.text)
            stop = self.stop_condition()
            if stop:
                with transaction.atomic():
                    return self.finish(RunStatus.FAILED, stop_reason=stop[0], error=stop[1])
            outcome = self.model_turn(None)
            if outcome:
                return outcome

    def stop_condition(self) -> tuple[str, str] | None:
        if len(self.steps) >= self.run.max_steps:
            return "max_steps", f"stopped after {len(self.steps)} steps (max_steps={self.run.max_steps})"
        budget = self.run.token_budget
        if budget and self.run.total_tokens >= budget:
            return "token_budget", f"token budget exhausted ({self.run.total_tokens} of {budget})"
        max_cost = Decimal(str(settings.AGENTRUNS_MAX_COST_USD or 0))
        if max_cost and self.run.cost_usd >= max_cost:
            return "cost_budget", f"cost budget exhausted (${self.run.cost_usd} of ${max_cost})"
        return None

    # ---------------------------------------------------------------- terminal transitions
    def finish(self, status: str, *, output: str = "", error: str = "", stop_reason: str = "") -> str:
        events, fields = self._finish_changes(status, output=output, error=error, stop_reason=stop_reason)
        self.commit(events, release=True, set_fields=fields)
        return status

    @staticmethod
    def _finish_changes(
        status: str, *, output: str = "", error: str = "", stop_reason: str = ""
    ) -> tuple[list[tuple[str, dict]], dict[str, Any]]:
        events: list[tuple[str, dict]] = []
        if output:
            events.append(("run.output", {"text": output}))
        events.append(("run.status", {"status": status, "error": error, "stop_reason": stop_reason}))
        fields = {
            "status": status,
            "output": output,
            "error": error,
            "stop_reason": stop_reason,
            "finished_at": timezone.now(),
            "cancel_requested": False,
        }
        return events, fields

    def park(self) -> str:
        self.commit(
            [("run.status", {"status": RunStatus.WAITING})],
            release=True,
            set_fields={"status": RunStatus.WAITING},
        )
        if self.cancel_requested:
            # a cancel arrived while we were parking: now that nobody executes the run it can be
            # cancelled for real (and its fresh inbox item withdrawn)
            from .services import ActionRefused, cancel_run

            def cancel_parked() -> None:
                try:
                    cancel_run(self.run_id, reason="cancelled while parking")
                except ActionRefused:
                    pass

            transaction.on_commit(cancel_parked)
        return RunStatus.WAITING

    def yield_slice(self) -> str:
        from .services import enqueue

        with transaction.atomic():
            self.commit(
                [("run.status", {"status": RunStatus.QUEUED, "reason": "time slice"})],
                release=True,
                set_fields={"status": RunStatus.QUEUED, "enqueued_at": timezone.now()},
            )
            enqueue(self.run_id)
        return RunStatus.QUEUED

    # ---------------------------------------------------------------- recovery
    def recover(self, step: Step) -> str | None:
        """A step left `running` by a dead worker (DESIGN.md 4.4)."""
        now = timezone.now()
        if step.kind == StepKind.MODEL:
            # re-requested as a new attempt; its streamed text is superseded, not merged
            with transaction.atomic():
                self._close_attempt(step, AttemptOutcome.CRASHED, "worker died mid-stream", now)
                step.status = StepStatus.PENDING
                step.save(update_fields=["status"])
                self.commit([("model.superseded", {"step": step.index, "attempt": step.attempts})])
            return None
        policy = self.run.tool_snapshot.get(step.tool, {})
        if policy.get("side_effect") and policy.get("idempotency") == "none":
            from approvals.services import open_reconciliation

            with transaction.atomic():
                self._close_attempt(step, AttemptOutcome.UNKNOWN, "worker died mid-call", now)
                step.status = StepStatus.UNKNOWN
                step.save(update_fields=["status"])
                open_reconciliation(step, self.run.agent)
                self.commit(
                    [
                        ("step.unknown", self._step_data(step)),
                        ("approval.requested", {"step": step.index, "kind": "reconciliation"}),
                    ]
                )
                return self.park()
        with transaction.atomic():
            self._close_attempt(step, AttemptOutcome.CRASHED, "worker died mid-call", now)
            step.status = StepStatus.PENDING
            step.save(update_fields=["status"])
            self.commit([("step.recovered", self._step_data(step))])
        return None

    def _close_attempt(self, step: Step, outcome: str, error: str, now: Any) -> None:
        StepAttempt.objects.filter(step=step, number=step.attempts, finished_at__isnull=True).update(
            outcome=outcome, error=error, finished_at=now
        )

    # ---------------------------------------------------------------- model steps
    def model_turn(self, step: Step | None) -> str | None:
        """One model step; returns the run's final status when the answer finished the run."""
        if step is None:
            index = len(self.steps)
            step_id = uuid.uuid4()
            step = Step(
                id=step_id,
                run_id=self.run_id,
                index=index,
                kind=StepKind.MODEL,
                idempotency_key=step_key(self.run_id, step_id),
                status=StepStatus.RUNNING,
            )
            step._state.adding = True
            self.steps.append(step)
        messages = self.conversation.extend(self.steps[: step.index])
        while True:
            attempt = step.attempts + 1
            try:
                return self._stream_model(step, attempt, messages)
            except ModelError as exc:
                if exc.retryable and attempt < MODEL_MAX_ATTEMPTS:
                    self._record_model_failure(step, attempt, exc, final=False)
                    time.sleep(min(10.0, 0.5 * 2**attempt))
                    continue
                self._record_model_failure(step, attempt, exc, final=True)
                raise _RunFailed(f"model error: {exc}") from exc

    def _stream_model(self, step: Step, attempt: int, messages: list[dict]) -> str | None:
        started = timezone.now()
        request = ModelRequest(
            model=self.run.model, messages=messages, tools=self.tool_schemas, agent=self.agent
        )
        flush_s = float(settings.AGENTRUNS_DELTA_FLUSH_MS) / 1000.0
        flush_chars = int(settings.AGENTRUNS_DELTA_FLUSH_CHARS)
        text: list[str] = []
        pending = ""
        calls: list[ToolCall] = []
        usage = Usage()
        last_flush = time.monotonic()
        for chunk in self.provider.stream(request):
            if isinstance(chunk, TextDelta):
                text.append(chunk.text)
                pending += chunk.text
                if len(pending) >= flush_chars or time.monotonic() - last_flush >= flush_s:
                    self._flush_delta(step, attempt, pending, started)
                    pending, last_flush = "", time.monotonic()
                    failpoints.hit("model_streaming", tool=self.run.agent, step_id=step.id)
            elif isinstance(chunk, ToolCall):
                calls.append(chunk)
            elif isinstance(chunk, Usage):
                usage = chunk
        return self._complete_model_step(step, attempt, "".join(text), pending, calls, usage, started)

    def _begin_attempt(self, step: Step, attempt: int, started: Any, status: str) -> None:
        """Persist the step (first time: insert) as running with a fresh attempt row."""
        step.status = status
        step.attempts = attempt
        step.started_at = step.started_at or started
        step.save()  # insert on first flush, update afterwards
        step._state.adding = False
        StepAttempt.objects.create(step=step, number=attempt, worker=self.owner, started_at=started)

    def _flush_delta(self, step: Step, attempt: int, text: str, started: Any) -> None:
        with transaction.atomic():
            events = []
            if step._state.adding or step.attempts < attempt:
                self._begin_attempt(step, attempt, started, StepStatus.RUNNING)
                events.append(("step.started", self._step_data(step)))
            events.append(("model.delta", {"step": step.index, "attempt": attempt, "text": text}))
            self.commit(events)
        self.check_lease()

    def _complete_model_step(
        self,
        step: Step,
        attempt: int,
        text: str,
        tail: str,
        calls: list[ToolCall],
        usage: Usage,
        started: Any,
    ) -> None:
        now = timezone.now()
        events: list[tuple[str, dict]] = []
        planned = self._plan_tool_steps(calls, now)
        # read-only calls at the head of the plan run now and are recorded in the model's commit:
        # if we die first, both the model turn and the read are simply done again
        eager = self._run_read_only_prefix(planned)
        batch = WriteBatch()
        # one commit: the model step, its plan, the eager reads, and the finish if it answered
        first_commit = step._state.adding or step.attempts < attempt
        step.status = StepStatus.SUCCEEDED
        step.text = text
        step.tool_calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
        step.prompt_tokens, step.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        step.finished_at = now
        step.error = ""
        new_rows: list[Step] = []
        new_attempts: list[StepAttempt] = []
        if first_commit:  # nothing streamed by this attempt: its rows go in with the plan
            step.attempts = attempt
            step.started_at = step.started_at or started
            if step._state.adding:
                new_rows.append(step)
            else:  # a re-run of a step a dead worker left behind
                batch.update(step, MODEL_STEP_FIELDS + ["attempts", "started_at"])
            new_attempts.append(StepAttempt(
                step=step, number=attempt, worker=self.owner, started_at=started,
                finished_at=now, outcome=AttemptOutcome.SUCCEEDED,
            ))
            events.append(("step.started", {**self._step_data(step), "status": StepStatus.RUNNING}))
        else:
            batch.update(step, MODEL_STEP_FIELDS)
            batch.update(
                StepAttempt(step=step, number=attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED),
                ["finished_at", "outcome"], where={"step": step.id, "number": attempt},
            )
        if tail:
            events.append(("model.delta", {"step": step.index, "attempt": attempt, "text": tail}))
        events.append(("step.succeeded", self._step_data(step)))
        begun = self._begin_next_side_effect(planned, eager, now)
        batch.insert(new_rows + planned)
        batch.insert(new_attempts + [row for _, row in eager] + begun)
        for planned_step in planned:
            events.append(("step.planned", {**self._step_data(planned_step), "status": StepStatus.PENDING}))
            if planned_step.status == StepStatus.SUCCEEDED:
                events.append(("step.succeeded", self._step_data(planned_step)))
            elif planned_step.status == StepStatus.RUNNING:
                events.append(("step.started", self._step_data(planned_step)))
        self.run.prompt_tokens += usage.prompt_tokens
        self.run.completion_tokens += usage.completion_tokens
        cost = model_cost_usd(self.run.model or settings.AGENTRUNS_MODEL, usage)
        self.run.cost_usd = Decimal(self.run.cost_usd) + cost
        fields: dict[str, Any] = {"step_count": len(self.steps)}
        final = not calls  # the answer: finish the run in this same commit
        if final:
            finish_events, finish_fields = self._finish_changes(RunStatus.SUCCEEDED, output=text)
            events.extend(finish_events)
            fields.update(finish_fields)
        self.commit(
            events,
            release=final,
            batch=batch,
            set_fields=fields,
            incr_fields={
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cost_usd": cost,
            },
        )
        for eager_step, _ in eager:
            failpoints.hit("step_persisted", tool=eager_step.tool, step_id=eager_step.id)
        for attempt_row in begun:
            failpoints.hit("step_started", tool=attempt_row.step.tool, step_id=attempt_row.step_id)
        return RunStatus.SUCCEEDED if final else None

    def _run_read_only_prefix(self, planned: list[Step]) -> list[tuple[Step, StepAttempt]]:
        done = []
        for step in planned:
            if step.status != StepStatus.PENDING:
                continue  # a refused call: already failed, its error goes back to the model
            tool = get_tool(step.tool)
            if tool.side_effect or tool.needs_approval(step.arguments):
                break  # order matters: nothing after a side effect runs ahead of it
            started = timezone.now()
            failpoints.hit("step_started", tool=step.tool, step_id=step.id)
            ctx = ToolContext(run=self.run, step=step, attempt=1, idempotency_key=step.idempotency_key)
            try:
                result = json.loads(json.dumps(tool.func(ctx, **step.arguments), default=str))
            except Exception:
                break  # leave it pending: the normal path runs it with its retry policy
            failpoints.hit("tool_returned", tool=step.tool, step_id=step.id)
            now = timezone.now()
            step.status, step.result, step.attempts = StepStatus.SUCCEEDED, result, 1
            step.started_at, step.finished_at = started, now
            done.append((step, StepAttempt(step=step, number=1, worker=self.owner, started_at=started,
                                           finished_at=now, outcome=AttemptOutcome.SUCCEEDED)))
        return done

    def _begin_next_side_effect(
        self, planned: list[Step], eager: list[tuple[Step, StepAttempt]], now: Any
    ) -> list[StepAttempt]:
        """The first side-effect call of the plan is written as running + attempt 1 in the model's
        commit: its idempotency key is durable before the call, with no extra commit."""
        eager_ids = {s.id for s, _ in eager}
        for step in planned:
            if step.id in eager_ids or step.status != StepStatus.PENDING:
                continue
            tool = get_tool(step.tool)
            if not tool.side_effect or tool.needs_approval(step.arguments):
                return []
            step.status, step.attempts, step.started_at = StepStatus.RUNNING, 1, now
            self.begun_here.add(step.id)
            return [StepAttempt(step=step, number=1, worker=self.owner, started_at=now)]
        return []

    def _plan_tool_steps(self, calls: list[ToolCall], now: Any) -> list[Step]:
        """Tool calls become rows in the commit that records the model response (invariant 3).
        Bad calls (unknown tool, outside the snapshot, bad JSON, schema) are failed steps whose
        error goes back to the model (invariant 7)."""
        planned = []
        for call in calls:
            step_id = uuid.uuid4()
            step = Step(
                id=step_id,
                run_id=self.run_id,
                index=len(self.steps),
                kind=StepKind.TOOL,
                tool=call.name[:100],
                call_id=call.id[:100],
                idempotency_key=step_key(self.run_id, step_id),
            )
            try:
                step.arguments = self._validated_arguments(call)
            except (ToolArgumentsError, UnknownTool) as exc:
                step.status = StepStatus.FAILED
                step.error = str(exc)
                step.finished_at = now
            self.steps.append(step)
            planned.append(step)
        return planned

    def _validated_arguments(self, call: ToolCall) -> dict:
        if call.name not in self.run.tool_snapshot:
            raise UnknownTool(f"tool {call.name!r} is not available to this run")
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(f"{call.name}: arguments are not valid JSON ({exc})") from None
        return get_tool(call.name).validate(arguments)

    def _record_model_failure(self, step: Step, attempt: int, exc: ModelError, *, final: bool) -> None:
        now = timezone.now()
        with transaction.atomic():
            # deltas of this attempt were already flushed: a retry must not merge with them
            streamed = not (step._state.adding or step.attempts < attempt)
            if not streamed:
                self._begin_attempt(step, attempt, now, StepStatus.RUNNING)
            StepAttempt.objects.filter(step=step, number=attempt).update(
                finished_at=now,
                outcome=AttemptOutcome.FAILED if final else AttemptOutcome.RETRYING,
                error=str(exc),
            )
            step.error = str(exc)
            step.status = StepStatus.FAILED if final else StepStatus.RUNNING
            if final:
                step.finished_at = now
            step.save(update_fields=["error", "status", "finished_at"])
            etype = "step.failed" if final else "step.retry_scheduled"
            events = [(etype, self._step_data(step))]
            if streamed and not final:  # the next attempt re-streams the turn from scratch
                events.append(("model.superseded", {"step": step.index, "attempt": attempt}))
            self.commit(events)

    # ---------------------------------------------------------------- tool steps
    def tool_step(self, step: Step) -> str | None:
        tool = get_tool(step.tool)
        if not step.approved and tool.needs_approval(step.arguments):
            from approvals.services import open_approval

            with transaction.atomic():
                step.status = StepStatus.WAITING_APPROVAL
                step.save(update_fields=["status"])
                approval = open_approval(step, self.run.agent)
                self.commit(
                    [
                        ("step.waiting_approval", self._step_data(step)),
                        ("approval.requested", {"step": step.index, "approval": approval.id,
                                                "kind": "approval", "tool": step.tool}),
                    ]
                )
                return self.park()
        if step.next_attempt_at and not self._wait_for_retry(step.next_attempt_at):
            with transaction.atomic():
                return self.finish(RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request")
        return self._execute(step, tool)

    def _wait_for_retry(self, due: Any) -> bool:
        """Sleep until a retry is due, noticing a cancel meanwhile (False: cancelled)."""
        while (delay := (due - timezone.now()).total_seconds()) > 0:
            time.sleep(min(delay, 0.5))
            self.check_lease()
            if Run.objects.filter(id=self.run_id, cancel_requested=True).exists():
                return False
        return True

    def _execute(self, step: Step, tool: Tool) -> str | None:
        if step.id in self.begun_here:  # its "before" commit was the model's commit
            self.begun_here.discard(step.id)
            attempt, started = step.attempts, step.started_at
        else:
            attempt = step.attempts + 1
            started = timezone.now()
            if tool.side_effect:
                # the "before" commit: running + attempt, so a crash is seen and resumed by class
                step.status, step.attempts = StepStatus.RUNNING, attempt
                step.started_at = step.started_at or started
                batch = WriteBatch().update(step, ["status", "attempts", "started_at"])
                batch.insert([StepAttempt(step=step, number=attempt, worker=self.owner, started_at=started)])
                self.commit([("step.started", self._step_data(step))], batch=batch)
            failpoints.hit("step_started", tool=step.tool, step_id=step.id)
        ctx = ToolContext(run=self.run, step=step, attempt=attempt, idempotency_key=step.idempotency_key)
        try:
            result = tool.func(ctx, **step.arguments)
            result = json.loads(json.dumps(result, default=str))
        except Exception as exc:
            return self._tool_failed(step, tool, attempt, started, exc)
        failpoints.hit("tool_returned", tool=step.tool, step_id=step.id)
        now = timezone.now()
        batch = WriteBatch()
        if not tool.side_effect:
            step.started_at = started
            batch.insert([StepAttempt(
                step=step, number=attempt, worker=self.owner, started_at=started,
                finished_at=now, outcome=AttemptOutcome.SUCCEEDED,
            )])
        else:
            batch.update(
                StepAttempt(step=step, number=attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED),
                ["finished_at", "outcome"], where={"step": step.id, "number": attempt},
            )
        step.status, step.result, step.error = StepStatus.SUCCEEDED, result, ""
        step.attempts, step.finished_at, step.next_attempt_at = attempt, now, None
        batch.update(step, TOOL_RESULT_FIELDS)
        self.commit([("step.succeeded", self._step_data(step))], batch=batch)
        failpoints.hit("step_persisted", tool=step.tool, step_id=step.id)
        return None

    def _tool_failed(self, step: Step, tool: Tool, attempt: int, started: Any, exc: Exception) -> str | None:
        now = timezone.now()
        retry = tool.retry.is_retryable(exc) and attempt - step.retry_base < tool.retry.max_attempts
        outcome = AttemptOutcome.RETRYING if retry else AttemptOutcome.FAILED
        with transaction.atomic():
            fields = dict(finished_at=now, outcome=outcome, error=str(exc)[:2000],
                          traceback=traceback.format_exc()[-8000:])
            if tool.side_effect:
                StepAttempt.objects.filter(step=step, number=attempt).update(**fields)
            else:
                StepAttempt.objects.create(step=step, number=attempt, worker=self.owner,
                                           started_at=started, **fields)
            step.attempts, step.error = attempt, f"{type(exc).__name__}: {exc}"
            step.started_at = step.started_at or started
            if retry:
                delay = tool.retry.delay_for(attempt)
                step.status, step.next_attempt_at = StepStatus.PENDING, now + timedelta(seconds=delay)
                step.save()
                data = {**self._step_data(step), "next_attempt_at": step.next_attempt_at.isoformat()}
                self.commit([("step.retry_scheduled", data)])
                return None
            step.status, step.finished_at, step.next_attempt_at = StepStatus.FAILED, now, None
            step.save()
            self.commit([("step.failed", self._step_data(step))])
            return self.finish(
                RunStatus.FAILED, error=f"step #{step.index} {step.tool} failed: {step.error}"
            )

    # ---------------------------------------------------------------- helpers
    def _step_data(self, step: Step) -> dict:
        return {
            "step": step.index,
            "id": str(step.id),
            "kind": step.kind,
            "tool": step.tool,
            "status": step.status,
            "attempts": step.attempts,
            "error": step.error,
        }


class _RunFailed(Exception):
    pass
