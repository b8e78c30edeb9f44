"""The durable executor (DESIGN.md section 4).

`RunExecutor(run_id).advance()` is the body of the `advance_run` task. It claims the run's lease
with one conditional UPDATE, then drives the run step by step until it finishes, parks for a
human, yields its time slice, or loses the lease. Every commit it makes is fenced on the lease
(`RunStore.commit`), renews it, allocates the event seqs, and reads the cancel flag, all in one
statement, so the per-step cost does not grow with the run's history.

Commits per step: a read-only tool runs and is recorded in one commit; a side-effect tool gets one
commit before the call (running + attempt, with the stable idempotency key already durable) and
one after (result). A model step is one commit plus one per streamed delta batch; the tool steps
it asks for are planned in that same commit (docs/architecture.md has the table).

Here: the lease, the loop and recovery (model steps: `model_steps.py`, tool steps:
`tool_steps.py`; status changes: `transitions.py`). In a worker process the executor runs on a thread of the process's pool (`pool.py`), which
passes `drain`: once it is set (SIGTERM, a q2 recycle) the run hands itself over at its next
step boundary, exactly like a time slice ending. There, too, a long retry backoff gives the
thread back (`back_off`) instead of sleeping on it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepKind, StepStatus
from agentruns.registry import UnknownAgent, get_agent, get_tool, has_tool
from agentruns.runtime import tracing, writer
from agentruns.runtime.dispatch import concurrency, lease
from agentruns.runtime.dispatch.lease import Heartbeat
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.events import EventSpec, EventType, LeaseLost, step_event_data
from agentruns.runtime.execution import transitions
from agentruns.runtime.execution.cancel import cancel_run, withdraw_unrun_work
from agentruns.runtime.execution.conversation import Conversation
from agentruns.runtime.execution.model_steps import ModelSteps, RunFailed
from agentruns.runtime.execution.slice_state import SliceState
from agentruns.runtime.execution.tool_steps import ToolSteps
from agentruns.runtime.execution.transitions import ActionRefused, RunChange
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.providers import ModelError, get_provider
from agentruns.runtime.store import get_store
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.ids import worker_id

log = logging.getLogger(__name__)


class RunExecutor(ModelSteps, ToolSteps):
    # `self.state` (slice_state.SliceState): set once `_drive` has loaded the run and its agent
    def __init__(
        self,
        run_id: uuid.UUID | str,
        owner: str | None = None,
        *,
        drain: threading.Event | None = None,
    ) -> None:
        self.run_id = uuid.UUID(str(run_id))
        self.owner = owner or worker_id()
        self.ttl = conf.LEASE_TTL_SECONDS
        self.store = get_store()
        self.cancel_requested = False
        self.heartbeat: Heartbeat | None = None
        # set by the pool this executor runs in (None: executed in-process, nobody drains it)
        self.drain = drain
        self.trace_slice: Any = None  # tracing.begin_slice: the slice span, None when off
        self.run_key: tuple[str, str | None] | None = None  # (agent, concurrency key) once read

    # ---------------------------------------------------------------- lease
    def claim(self) -> bool:
        now = timezone.now()
        lease = {"lease_owner": self.owner, "lease_expires_at": now + timedelta(seconds=self.ttl)}
        return writer.claim(
            self.run_id, self.owner, transitions.started().events, lease=lease, now=now
        )

    def commit(
        self,
        events: list[EventSpec],
        *,
        batch: WriteBatch | None = None,
        end_transaction: bool = False,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
    ) -> int:
        """The fenced run UPDATE + events, with the writes in `batch`, as one transaction.

        It renews the lease (unless `set_fields` releases it), allocates the seqs and reads the
        cancel flag, or raises LeaseLost (rolling the transaction back) when the lease is no
        longer ours. `end_transaction`: the caller's atomic block ends right after this."""
        now = timezone.now()
        fields = dict(set_fields or {})
        if "lease_owner" not in fields:
            fields["lease_expires_at"] = now + timedelta(seconds=self.ttl)
        # an end lets the run's concurrency key go in the same transaction (nothing without one)
        with concurrency.following(self.run_id, fields.get("status"), self.run_key):
            last_seq, self.cancel_requested = writer.commit(
                self.run_id,
                self.owner,
                events,
                now=now,
                set_fields=fields,
                incr_fields=incr_fields,
                batch=batch,
                end_transaction=end_transaction,
            )
        if self.heartbeat is not None:
            self.heartbeat.renewed()
        return last_seq

    def check_lease(self) -> None:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(str(self.run_id))

    # ---------------------------------------------------------------- main loop
    @tracing.sliced
    def advance(self, claimed: Run | None = None) -> str:
        """Execute the run until it finishes, parks, yields or loses its lease. `claimed`: the
        run as created already leased by `self.owner` (`services.execute_inline`); otherwise
        claim it.

        An infrastructure error (`faults.py`) anywhere in the slice is weather, not a verdict:
        the slice stops without writing, no attempt is counted, and the run is left to the lease
        keeper to release and ring once the database answers (`"weather"`). Only the engine's own
        errors end the run as "internal error"."""
        try:
            if claimed is None and not self.claim():
                return "busy"
        except Exception as exc:
            if is_infrastructure_error(exc):
                return self.weathered(exc)  # nothing claimed: the keeper only rings it
            raise
        self.heartbeat = Heartbeat(self.run_id, self.owner, self.ttl)
        self.heartbeat.start()
        try:
            try:
                return self._drive(claimed)
            except RunFailed as exc:
                return self.finish(RunStatus.FAILED, error=str(exc))
        except LeaseLost:
            log.warning("run %s: lease lost, another worker continues", self.run_id)
            return "lease_lost"
        except Exception as exc:
            if is_infrastructure_error(exc):
                return self.weathered(exc)
            # an engine bug must not leave a run stuck
            log.exception("run %s: engine error", self.run_id)
            close_old_connections()
            try:
                return self.finish(RunStatus.FAILED, error=f"internal error: {exc!r}")
            except LeaseLost:
                return "lease_lost"
            except Exception as second:
                if is_infrastructure_error(second):
                    return self.weathered(second)
                raise
        finally:
            self.heartbeat.stop()

    def weathered(self, exc: BaseException) -> str:
        """The database (or Redis) failed under this slice: write nothing, count nothing; the
        process's lease keeper releases the lease (if this executor holds it) and rings the run
        when the database answers again, or the lease lapses and the sweeper does."""
        weather.outage_of(exc).noticed(exc, f"run {self.run_id}")
        log.info("run %s: slice stopped by an outage: %r", self.run_id, exc)
        # a connection that saw the error: back to the pool (which discards it) or closed
        try:
            connection.close()
        except Exception:
            pass
        lease.hand_back(self.run_id, self.owner)
        return "weather"

    def _drive(self, claimed: Run | None) -> str:
        run = claimed if claimed is not None else self.store.load_run(self.run_id)
        self.run_key = (run.agent, run.concurrency_key)
        self.trace_slice = tracing.begin_slice(self, run)
        self.cancel_requested = run.cancel_requested
        try:
            agent = get_agent(run.agent)
        except UnknownAgent as exc:  # a deploy without its module: wait for it, no verdict
            return self.back_off(
                timezone.now() + timedelta(seconds=conf.AGENT_MISSING_RETRY_SECONDS),
                waiting=f"{exc}: not deployed in this worker, the run waits for it",
            )
        if run.error:  # what it waited for (its agent) is back
            Run.objects.filter(id=self.run_id, status=RunStatus.RUNNING).update(error="")
        try:
            provider = get_provider(run.model or conf.MODEL, agent)
        except ModelError as exc:
            return self.finish(RunStatus.FAILED, error=f"model error: {exc}")
        # a brand-new run (no steps counted, only its created + running events) has no history
        # to read; anything else loads it once
        fresh = run.step_count == 0 and run.last_seq <= 2
        self.state = SliceState(
            run=run,
            agent=agent,
            provider=provider,
            # only what the run's permission snapshot allows (DESIGN.md 4.6); a call to anything
            # else is refused when planned (`_validated_arguments`)
            tool_schemas=[get_tool(name).schema() for name in run.allowed_tools if has_tool(name)],
            steps=[] if fresh else list(Step.objects.filter(run_id=self.run_id).order_by("index")),
            conversation=Conversation(agent, run),
        )
        state = self.state
        slice_ends = time.monotonic() + conf.SLICE_SECONDS

        while True:
            self.check_lease()
            step = state.next_step()
            if self.cancel_requested:
                return self.cancel_at_boundary()
            if state.run.deadline_at and timezone.now() >= state.run.deadline_at:
                return self.finish(
                    RunStatus.FAILED, stop_reason="deadline", error="the run's deadline passed"
                )
            # a side-effect call whose "running + attempt" went out with the model's commit is
            # part of that step: made here first, or the next worker would take it for a call
            # a crash interrupted (an idempotency="none" one would go to reconciliation)
            if not state.begun_here:
                if time.monotonic() >= slice_ends:
                    return self.yield_slice()
                if self.drain is not None and self.drain.is_set():
                    # the process stops (SIGTERM, recycle): hand the run over between two steps
                    return self.yield_slice(reason="worker draining")

            if step is not None:
                if step.status in (StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN):
                    return self.park()
                if step.status == StepStatus.RUNNING and step.id not in state.begun_here:
                    outcome = self.recover(step)
                elif step.kind == StepKind.MODEL:
                    with tracing.model_span(self, step):
                        outcome = self.model_turn(step)
                else:
                    outcome = self.tool_step(step)
                if outcome:
                    return outcome
                continue

            last = state.steps[-1] if state.steps else None
            if last is not None and last.kind == StepKind.MODEL and not last.tool_calls:
                return self.finish(RunStatus.SUCCEEDED, output=last.text)
            stop = self.stop_condition()
            if stop:
                return self.finish(RunStatus.FAILED, stop_reason=stop[0], error=stop[1])
            with tracing.model_span(self, None):
                outcome = self.model_turn(None)
            if outcome:
                return outcome

    def stop_condition(self) -> tuple[str, str] | None:
        state = self.state
        if len(state.steps) >= state.run.max_steps:
            return (
                "max_steps",
                f"stopped after {len(state.steps)} steps (max_steps={state.run.max_steps})",
            )
        run, budget = state.run, state.run.token_budget
        if budget and run.total_tokens >= budget:
            return "token_budget", f"token budget exhausted ({run.total_tokens} of {budget})"
        limit = getattr(state.agent, "max_cost_usd", None)
        max_cost = Decimal(str(limit if limit is not None else conf.MAX_COST_USD or 0))
        if max_cost and run.cost_usd >= max_cost:
            return "cost_budget", f"cost budget exhausted (${run.cost_usd} of ${max_cost})"
        return None

    # ---------------------------------------------------------------- status changes
    def apply(
        self, change: RunChange, *, events_before: list[EventSpec] = (), **commit: Any
    ) -> int:
        """Commit a change of the run's status (transitions.py), after `events_before`."""
        transitions.announce(self.run_id, change)  # rolled back with the commit if it fails
        return self.commit([*events_before, *change.events], set_fields=change.fields, **commit)

    # atomic(savepoint=False): one transaction of its own, or part of the caller's (no savepoint)
    def finish(
        self, status: str, *, output: str = "", error: str = "", stop_reason: str = ""
    ) -> str:
        with transaction.atomic(savepoint=False):
            state = getattr(self, "state", None)  # unset when the slice failed loading
            executions.run_ended(state.run if state else self.run_id, f"the run ended ({status})")
            self.apply(
                transitions.finished(status, output=output, error=error, stop_reason=stop_reason)
            )
        return status

    def cancel_at_boundary(self) -> str:
        """Cancelled between two steps. A side-effect call whose "running + attempt" went out
        with the model's commit, the same commit that read the cancel, was never made: it ends
        as failed, not left running in a cancelled run. The rest as when an idle run is cancelled:
        steps nobody will run are skipped, inbox items withdrawn."""
        now = timezone.now()
        not_made = "the run was cancelled before the call was made"
        events: list[EventSpec] = []
        with transaction.atomic(savepoint=False):
            for step in self.state.steps[self.state.cursor :]:
                if step.id in self.state.begun_here:
                    self._close_attempt(step, AttemptOutcome.FAILED, not_made, now)
                    step.status, step.error, step.finished_at = StepStatus.FAILED, not_made, now
                    writer.save_step(step, ["status", "error", "finished_at"])
                    events.append((EventType.STEP_FAILED, step_event_data(step)))
            self.state.begun_here.clear()
            events += withdraw_unrun_work(self.state.run, now, who=None)
            executions.run_ended(self.state.run, "the run was cancelled during the call")
            self.apply(
                transitions.finished(
                    RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request"
                ),
                events_before=events,
            )
        return RunStatus.CANCELLED

    def park(self, *, events_before: list[EventSpec] = ()) -> str:
        with transaction.atomic(savepoint=False):
            self.apply(transitions.parked(), events_before=events_before)
            if self.cancel_requested:
                # a cancel arrived while we were parking: now that nobody executes the run it can
                # be cancelled for real (and its fresh inbox item withdrawn)
                transaction.on_commit(self._cancel_parked)
        return RunStatus.WAITING

    def _cancel_parked(self) -> None:
        try:
            cancel_run(self.run_id, reason="cancelled while parking")
        except ActionRefused:
            pass

    def yield_slice(self, reason: str = "time slice") -> str:
        with transaction.atomic(savepoint=False):
            self.apply(transitions.yielded(timezone.now(), reason=reason))
            enqueue(self.run_id)
        return RunStatus.QUEUED

    def back_off(self, until: Any, **why: Any) -> str:
        """Wait for a retry without a thread: queued again, its doorbell rings at `until`
        (`why`: `reason`, `waiting` and event data for `transitions.backing_off`)."""
        with transaction.atomic(savepoint=False):
            self.apply(transitions.backing_off(until, **why))
            enqueue(self.run_id, not_before=until)
        return RunStatus.QUEUED

    # ---------------------------------------------------------------- recovery
    def recover(self, step: Step) -> str | None:
        """A step left `running` by a dead worker (DESIGN.md 4.4)."""
        tracing.worker_lost(self, step)
        now = timezone.now()
        if step.kind == StepKind.MODEL:
            # re-requested as a new attempt; its streamed text is superseded, not merged
            with transaction.atomic():
                self._close_attempt(step, AttemptOutcome.CRASHED, "worker died mid-stream", now)
                step.status = StepStatus.PENDING
                writer.save_step(step, ["status"])
                self.commit(
                    [(EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": step.attempts})]
                )
            return None
        policy = self.state.run.tool_policy(step.tool)
        if policy.get("side_effect") and policy.get("idempotency") == "none":
            return self.outcome_unknown(step, "worker died mid-call")
        with transaction.atomic():
            self._close_attempt(step, AttemptOutcome.CRASHED, "worker died mid-call", now)
            step.status = StepStatus.PENDING
            writer.save_step(step, ["status"])
            self.commit([(EventType.STEP_RECOVERED, step_event_data(step))])
        return None

    def outcome_unknown(self, step: Step, why: str) -> str:
        """Nobody can tell whether the call took effect: the step is `unknown`, a reconciliation
        item goes to the inbox and the run waits for a person (DESIGN.md 4.5). Never guessed."""
        with transaction.atomic():
            self._close_attempt(step, AttemptOutcome.UNKNOWN, why, timezone.now())
            step.status = StepStatus.UNKNOWN
            writer.save_step(step, ["status"])
            inbox().open_reconciliation(step, self.state.run.agent)
            return self.park(
                events_before=[
                    (EventType.STEP_UNKNOWN, step_event_data(step)),
                    (EventType.APPROVAL_REQUESTED, {"step": step.index, "kind": "reconciliation"}),
                ]
            )

    def _close_attempt(self, step: Step, outcome: str, error: str, now: Any) -> None:
        writer.end_attempt(
            step, step.attempts, open_only=True, outcome=outcome, error=error, finished_at=now
        )
