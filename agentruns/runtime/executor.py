"""The durable executor (DESIGN.md section 4).

`RunExecutor(run_id).advance()` is the body of the `advance_run` task. It claims the run's lease
with one conditional UPDATE, then drives the run step by step until it finishes, parks for a
human, yields its time slice, or loses the lease. Every commit it makes is fenced on the lease
(`events.record(lease_owner=...)`), renews it, allocates the event seqs, and reads the cancel
flag, all in one UPDATE, so the per-step cost does not grow with the run's history.

Commits per step: a read-only tool runs and is recorded in one commit; a side-effect tool gets one
commit before the call (running + attempt, with the stable idempotency key already durable) and
one after (result). A model step is one commit plus one per streamed delta batch; the tool steps
it asks for are planned in that same commit (docs/architecture.md has the table).

This module holds the lease, the loop, recovery and the terminal transitions; model steps live in
`model_steps.py`, tool steps in `tool_steps.py` (mixins of `RunExecutor`).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections, transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentruns.models import (
    AttemptOutcome,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
)
from agentruns.registry import (
    UnknownAgent,
    get_agent,
    get_tool,
)
from agentruns.runtime import pgcommit
from agentruns.runtime.conversation import Conversation
from agentruns.runtime.events import LeaseLost, record, record_statement, recorded
from agentruns.runtime.lease import Heartbeat, worker_id
from agentruns.runtime.model_steps import ModelSteps, _RunFailed, step_key
from agentruns.runtime.providers import ModelError, get_provider
from agentruns.runtime.rows import WriteBatch
from agentruns.runtime.tool_steps import ToolSteps

log = logging.getLogger(__name__)

__all__ = ["RunExecutor", "execute_inline", "step_key", "worker_id"]


def execute_inline(agent_name: str, run_input: dict, **start: Any) -> tuple[Run, str]:
    """Start a run and execute it in this process, with no queue in between (scripts, benchmarks).

    The run is created already running under this process's lease (one statement on
    PostgreSQL), so no worker takes it meanwhile; if this process dies, the lease expires and the
    sweeper hands the run to the queue like any other. Returns (run, outcome of `advance`)."""
    from agentruns.services import start_run

    owner = worker_id()
    result = start_run(agent_name, run_input, claim_for=owner, **start)
    if not result.created:  # deduplicated: somebody else's run
        return result.run, result.run.status
    return result.run, RunExecutor(result.run.id, owner).advance(claimed=result.run)


class RunExecutor(ModelSteps, ToolSteps):
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
        end_transaction: bool = False,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
    ) -> int:
        """The fenced run UPDATE + events, with the writes in `batch`, as one transaction.

        On PostgreSQL one statement (`pgcommit`): it renews the lease, allocates the seqs and
        reads the cancel flag, or raises LeaseLost (rolling the transaction back) when the lease
        is no longer ours. `end_transaction`: the caller's atomic block ends right after this."""
        now = timezone.now()
        set_fields = dict(set_fields or {})
        if release:
            set_fields.update(lease_owner="", lease_expires_at=None)
        else:
            set_fields["lease_expires_at"] = now + timedelta(seconds=self.ttl)
        db = connections[DEFAULT_DB_ALIAS]  # one lookup through the thread-local proxy, not five
        if db.vendor == "postgresql":
            last_seq, cancel = pgcommit.commit(
                self.run_id, self.owner, events, set_fields=set_fields, incr_fields=incr_fields,
                rows=batch.json_rows(now) if batch is not None else None, now=now,
                end_transaction=end_transaction and self._outermost_atomic(db),
            )
        else:
            with transaction.atomic():
                if batch is not None:
                    batch.execute_each()
                last_seq, cancel = record(
                    self.run_id, events, lease_owner=self.owner, set_fields=set_fields,
                    incr_fields=incr_fields,
                )
        self.cancel_requested = cancel
        return last_seq

    @staticmethod
    def _outermost_atomic(db: Any) -> bool:
        # the COMMIT may ride along only when this is the outermost atomic block, no savepoints
        return db.in_atomic_block and not db.savepoint_ids and len(db.atomic_blocks) == 1

    def check_lease(self) -> None:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(str(self.run_id))

    # ---------------------------------------------------------------- main loop
    def advance(self, claimed: Run | None = None) -> str:
        """Execute the run until it finishes, parks, yields or loses its lease. `claimed`: the
        run as created already leased by `self.owner` (`execute_inline`); otherwise claim it."""
        if claimed is None and not self.claim():
            return "busy"
        self.heartbeat = Heartbeat(self.run_id, self.owner, self.ttl)
        self.heartbeat.start()
        try:
            return self._drive(claimed)
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

    def _drive(self, claimed: Run | None) -> str:
        self.run = claimed if claimed is not None else Run.objects.get(id=self.run_id)
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
        limit = getattr(self.agent, "max_cost_usd", None)
        max_cost = Decimal(str(limit if limit is not None else settings.AGENTRUNS_MAX_COST_USD or 0))
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
            from agentruns.services import ActionRefused, cancel_run

            def cancel_parked() -> None:
                try:
                    cancel_run(self.run_id, reason="cancelled while parking")
                except ActionRefused:
                    pass

            transaction.on_commit(cancel_parked)
        return RunStatus.WAITING

    def yield_slice(self) -> str:
        from agentruns.services import enqueue

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
