"""Tool steps of the executor: approval parking, the before/after commits, retries."""

from __future__ import annotations

import json
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, Run, RunStatus, Step, StepStatus
from agentruns.registry import (
    ApprovalRequested,
    OutcomeUnknown,
    ServerUnavailable,
    Tool,
    ToolContext,
    UnknownTool,
    get_tool,
)
from agentruns.registry.context import stepping
from agentruns.runtime import tracing, writer
from agentruns.runtime.access.permissions import needs_approval
from agentruns.runtime.dispatch import connections
from agentruns.runtime.events import EventType, step_event_data, succeeded_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.execution.slice_state import ExecutorHost
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.outages.tool_outage import ToolOutage
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.redaction import redact_text, secret_values, secrets_in_scope
from agentruns.runtime.values.text import storable
from agentruns.runtime.values.timestamps import iso

TOOL_RESULT_FIELDS = [
    "status",
    "result",
    "error",
    "attempts",
    "started_at",
    "finished_at",
    "next_attempt_at",
]


def call_tool(run: Run, step: Step, tool: Tool, ctx: ToolContext) -> Any:
    """The tool's function on the step's arguments, with the step's secret values masked in
    any log line it writes; its result as the JSON that will be stored."""
    secrets = secret_values(step.arguments, run.redacted_fields(step.tool))
    with tracing.tool_span(run, step, ctx) as traced, secrets_in_scope(secrets), stepping(ctx):
        returned = tool.func(ctx, **step.arguments)
        if traced is not None:
            traced.result(returned)
    return storable(json.loads(json.dumps(returned, default=str)))


class _CallFailed(Exception):
    """The tool raised (inside its transaction, when it has one)."""


class _Unreachable(Exception):
    """The call's server could not take it (`ServerUnavailable`): weather, not an attempt."""

    def __init__(self, error: ServerUnavailable, attempt: int, started: Any) -> None:
        super().__init__(str(error))
        self.error, self.attempt, self.started = error, attempt, started


class ToolSteps(ExecutorHost):
    """Mixin of RunExecutor: the host and the slice state it relies on are `slice_state.py`."""

    # ---------------------------------------------------------------- tool steps
    def tool_step(self, step: Step) -> str | None:
        try:
            tool = get_tool(step.tool)
        except UnknownTool:  # a deploy removed it after the call was planned (or approved)
            return self._refuse(step, f"refused: the tool {step.tool} is not deployed any more")
        if step.approved:
            # fail closed: only the exact arguments the final approval approved ever run
            if refusal := inbox().approved_call_refusal(step):
                return self._refuse(step, refusal)
        elif needs_approval(self.state.run, tool, step.arguments):
            return self._ask_approval(step)
        if step.next_attempt_at:
            delay = (step.next_attempt_at - timezone.now()).total_seconds()
            if self.drain is not None and delay > conf.RETRY_SLEEP_MAX_SECONDS:
                return self.back_off(step.next_attempt_at)  # the thread serves other runs
            if not self._wait_for_retry(step.next_attempt_at):
                return self.finish(
                    RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request"
                )
        return self._execute(step, tool)

    def _ask_approval(self, step: Step) -> str:
        """Park the run with an inbox item for this call (its rule holds, or the tool itself
        asked: a Pydantic AI tool's ApprovalRequired)."""
        with transaction.atomic():
            step.status = StepStatus.WAITING_APPROVAL
            writer.save_step(step, ["status"])
            approval_id = inbox().open_approval(step, self.state.run.agent)
            return self.park(
                events_before=[
                    (EventType.STEP_WAITING_APPROVAL, step_event_data(step, error="")),
                    (
                        EventType.APPROVAL_REQUESTED,
                        {
                            "step": step.index,
                            "approval": approval_id,
                            "kind": "approval",
                            "tool": step.tool,
                        },
                    ),
                ]
            )

    def _tool_asked_approval(self, step: Step, tool: Tool, attempt: int) -> str:
        """The tool raised ApprovalRequested before doing anything: its attempt ends (it made
        no call) and the step waits for a person, as if its rule had held."""
        if tool.commits_before_call:
            writer.end_attempt(
                step,
                attempt,
                finished_at=timezone.now(),
                outcome=AttemptOutcome.FAILED,
                error="the tool asked for approval first",
            )
        if operations.holds_key(self.state.run, step.tool):
            with transaction.atomic():  # nothing was made, and a parked call holds no key
                executions.settle(step.id, executions.RELEASED)
        return self._ask_approval(step)

    def _refuse(self, step: Step, reason: str) -> None:
        """The call is not made: the step ends rejected with `reason`, which the model receives
        as the tool's answer (as a person's rejection)."""
        with transaction.atomic():
            step.reject(reason)
            writer.save_step(step, Step.REJECTED_FIELDS)
            self.commit([(EventType.STEP_FAILED, step_event_data(step))])
        return None

    def _wait_for_retry(self, due: Any) -> bool:
        """Sleep until a short retry is due, noticing a cancel meanwhile (False: cancelled)."""
        while (delay := (due - timezone.now()).total_seconds()) > 0:
            connections.release()
            time.sleep(min(delay, 0.5))
            self.check_lease()
            if Run.objects.filter(id=self.run_id, cancel_requested=True).exists():
                return False
        return True

    def _execute(self, step: Step, tool: Tool) -> str | None:
        """Call the tool, waiting out its server's outage (tool_outage.py) between calls."""
        outage: ToolOutage | None = None
        while True:
            try:
                return self._attempt(step, tool)
            except _Unreachable as down:
                outage = outage or ToolOutage.resume(self.run_id, step.index)
                wait = outage.failed(down.error)
                if wait is None:  # down for AGENTRUNS_TOOL_OUTAGE_SECONDS: the step fails
                    verdict = outage.verdict(down.error)
                    return self._tool_failed(step, tool, down.attempt, down.started, verdict)
                if outcome := self._wait_out_tool_outage(step, tool, down, outage, wait):
                    return outcome

    def _wait_out_tool_outage(
        self, step: Step, tool: Tool, down: _Unreachable, outage: ToolOutage, wait: float
    ) -> str | None:
        """The call reached nothing: its attempt is undone (the policy's attempts are for the
        tool's own failures), the step says what it waits on, and the run backs off."""
        until = timezone.now() + timedelta(seconds=wait)
        secrets = secret_values([step.arguments], self.state.run.redacted_fields(step.tool))
        reason = redact_text(outage.reason(down.error), secrets)[:2000]
        with transaction.atomic():
            if operations.holds_key(self.state.run, step.tool):
                # nothing reached the server: the key is free while it is down
                executions.settle(step.id, executions.RELEASED)
            if tool.commits_before_call:
                writer.undo_attempt(step, down.attempt)
            step.status, step.attempts, step.error = StepStatus.PENDING, down.attempt - 1, reason
            writer.save_step(step, ["status", "attempts", "error"])
            data = step_event_data(
                step, next_attempt_at=iso(until), waiting_on=down.error.server, reason=reason
            )
            self.commit([(EventType.STEP_RETRY_SCHEDULED, data)])
        if self.drain is not None and wait > conf.RETRY_SLEEP_MAX_SECONDS:
            return self.back_off(until, reason=reason, tool_outage=outage.state())
        connections.release()
        if not self._wait_for_retry(until):
            return self.finish(
                RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request"
            )
        return None

    def _begin(self, step: Step, attempt: int, started: Any, end_transaction: bool = False) -> None:
        """The "before" commit: running + attempt, so a crash is seen and resumed by class."""
        step.status, step.attempts = StepStatus.RUNNING, attempt
        step.started_at = step.started_at or started
        batch = WriteBatch().update(step, ["status", "attempts", "started_at"])
        batch.insert([self._attempt_row(step, attempt, started)])
        self.commit(
            [(EventType.STEP_STARTED, step_event_data(step, error=""))],  # not a retry's old one
            batch=batch,
            end_transaction=end_transaction,
        )

    def _attempt(self, step: Step, tool: Tool) -> str | None:
        if step.id in self.state.begun_here:  # its "before" commit was the model's commit
            self.state.begun_here.discard(step.id)
            attempt, started = step.attempts, step.started_at
        else:
            attempt = step.attempts + 1
            started = timezone.now()
            if operations.gated(self.state.run, tool):
                # the call's operation key is taken (and its limit checked) in its "before"
                # commit: a crash leaves the key held by the step, resumed with it
                with transaction.atomic():
                    gate = operations.gate(
                        self.state.run, step, tool, first_attempt=attempt == step.retry_base + 1
                    )
                    if gate.go and tool.commits_before_call:
                        self._begin(step, attempt, started, end_transaction=True)
                if not gate.go:
                    return self._not_made(step, gate)
            elif tool.commits_before_call:
                self._begin(step, attempt, started)
            failpoints.hit("step_started", tool=step.tool, step_id=step.id)
        ctx = ToolContext(
            run=self.state.run, step=step, attempt=attempt, idempotency_key=step.idempotency_key
        )
        failure: Exception | None = None
        failure_tb = ""
        if not tool.transactional:
            connections.release()  # the call waits on the world, not on this database
        # a transactional tool's writes and its result commit together (or not at all): a failing
        # call rolls the transaction back and is then recorded as failed on its own
        try:
            with transaction.atomic() if tool.transactional else nullcontext():
                try:
                    result = call_tool(self.state.run, step, tool, ctx)
                except Exception as exc:
                    if is_infrastructure_error(exc):
                        raise  # the database went away under the tool: weather, not an attempt
                    failure, failure_tb = exc, traceback.format_exc()
                    raise _CallFailed from exc
                failpoints.hit("tool_returned", tool=step.tool, step_id=step.id)
                self._record_result(
                    step, tool, attempt, started, result, end_transaction=tool.transactional
                )
        except _CallFailed:
            pass
        if isinstance(failure, ApprovalRequested) and not step.approved:
            return self._tool_asked_approval(step, tool, attempt)
        if isinstance(failure, ServerUnavailable):
            raise _Unreachable(failure, attempt, started)
        if isinstance(failure, OutcomeUnknown) and tool.commits_before_call:
            # the call's connection broke after it was sent: reconciled, as after a dead worker
            secrets = secret_values([step.arguments], self.state.run.redacted_fields(step.tool))
            return self.outcome_unknown(step, redact_text(str(failure), secrets)[:2000])
        if failure is not None:
            return self._tool_failed(step, tool, attempt, started, failure, failure_tb)
        failpoints.hit("step_persisted", tool=step.tool, step_id=step.id)
        return None

    def _record_result(
        self,
        step: Step,
        tool: Tool,
        attempt: int,
        started: Any,
        result: Any,
        *,
        end_transaction: bool = False,
    ) -> None:
        now = timezone.now()
        batch = WriteBatch()
        if not tool.commits_before_call:
            step.started_at = started
            batch.insert(
                [
                    self._attempt_row(
                        step, attempt, started, finished_at=now, outcome=AttemptOutcome.SUCCEEDED
                    )
                ]
            )
        else:
            self._end_attempt(
                batch, step, attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED
            )
        step.status, step.result, step.error = StepStatus.SUCCEEDED, result, ""
        step.attempts, step.finished_at, step.next_attempt_at = attempt, now, None
        batch.update(step, TOOL_RESULT_FIELDS)
        # the key the call holds is done with its result in the same commit (or both are lost)
        keyed = operations.holds_key(self.state.run, step.tool)
        with transaction.atomic() if keyed and not end_transaction else nullcontext():
            if keyed:
                executions.settle(step.id, executions.DONE, result)
            self.commit(
                [(EventType.STEP_SUCCEEDED, succeeded_event_data(self.state.run, step))],
                batch=batch,
                end_transaction=end_transaction or keyed,
            )

    def _not_made(self, step: Step, gate: operations.Gate) -> str | None:
        """The gate kept the call from being made: refused (the model reads why), answered with
        the key's earlier execution (the step succeeds with it, marked already done), or the run
        waits for the call that holds the key (None: it was settled meanwhile, take it again)."""
        if gate.outcome == operations.REFUSED:
            return self._refuse(step, gate.reason)
        if gate.outcome == operations.DONE:
            now = timezone.now()
            step.status, step.error, step.next_attempt_at = StepStatus.SUCCEEDED, "", None
            step.result = operations.already_done(gate.key, gate.row)
            step.started_at, step.finished_at = step.started_at or now, now
            batch = WriteBatch().update(step, TOOL_RESULT_FIELDS)
            self.commit(
                [(EventType.STEP_SUCCEEDED, succeeded_event_data(self.state.run, step))],
                batch=batch,
            )
            return None
        until = timezone.now() + timedelta(seconds=operations.WAIT_POLL_SECONDS)
        with transaction.atomic():
            if executions.wait_for(gate.row.id, self.run_id):
                return self.back_off(until, waiting=gate.reason, operation_key=gate.key)
        return None

    def _tool_failed(
        self, step: Step, tool: Tool, attempt: int, started: Any, exc: Exception, tb: str = ""
    ) -> str | None:
        now = timezone.now()
        retry = tool.retry.is_retryable(exc) and attempt - step.retry_base < tool.retry.max_attempts
        outcome = AttemptOutcome.RETRYING if retry else AttemptOutcome.FAILED
        # people read these (pages, admin, events): the step's secret values and anything that
        # looks like a credential are masked before they are written
        secrets = secret_values(
            [step.arguments, step.result], self.state.run.redacted_fields(step.tool)
        )
        with transaction.atomic():
            fields = dict(
                finished_at=now,
                outcome=outcome,
                error=redact_text(str(exc), secrets)[:2000],
                traceback=redact_text(tb or traceback.format_exc(), secrets)[-8000:],
            )
            if tool.commits_before_call:
                writer.end_attempt(step, attempt, **fields)
            else:
                writer.add_attempt(step, attempt, worker=self.owner, started_at=started, **fields)
            step.attempts = attempt
            step.error = redact_text(f"{type(exc).__name__}: {exc}", secrets)
            step.started_at = step.started_at or started
            if retry:
                delay = tool.retry.delay_for(attempt)
                step.status, step.next_attempt_at = (
                    StepStatus.PENDING,
                    now + timedelta(seconds=delay),
                )
                writer.save_step(step)
                data = step_event_data(step, next_attempt_at=iso(step.next_attempt_at))
                self.commit([(EventType.STEP_RETRY_SCHEDULED, data)])
                return None
            step.status, step.finished_at, step.next_attempt_at = StepStatus.FAILED, now, None
            writer.save_step(step)
            if operations.holds_key(self.state.run, step.tool):
                executions.settle(step.id, executions.RELEASED)  # failed for good: free again
            self.commit([(EventType.STEP_FAILED, step_event_data(step))])
            return self.finish(
                RunStatus.FAILED, error=f"step #{step.index} {step.tool} failed: {step.error}"
            )
