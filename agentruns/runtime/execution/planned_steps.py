"""The tool calls a model turn asked for: planned as rows in the model's commit (DESIGN.md 4.4),
and the read-only (or transactional) calls at the head of the plan run before that commit so they
are recorded in it. Bad calls (unknown tool, outside the run's permissions, bad JSON, schema) are
failed steps whose error goes back to the model (DESIGN.md 4.8).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from agentruns.models import AttemptOutcome, Step, StepAttempt, StepKind, StepStatus
from agentruns.registry import ToolArgumentsError, ToolContext, UnknownTool, get_tool
from agentruns.runtime.access.permissions import needs_approval, refused_message
from agentruns.runtime.execution import failpoints
from agentruns.runtime.execution.slice_state import ExecutorHost
from agentruns.runtime.execution.tool_steps import call_tool
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.providers import ToolCall
from agentruns.runtime.store.rows import WriteBatch, build
from agentruns.runtime.values.ids import step_key
from agentruns.runtime.values.text import UnsafeValue, loads_strict, storable_text


class EagerCallFailed(Exception):
    """An eager call failed inside the model step's transaction (which must roll back)."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


class PlannedSteps(ExecutorHost):
    """Mixin of RunExecutor: the host and the slice state it relies on are `slice_state.py`."""

    def _eager_prefix(self, planned: list[Step]) -> list[Step]:
        """The calls at the head of the plan that may run before the model's commit."""
        head = []
        for step in planned:
            if step.status != StepStatus.PENDING:
                continue  # a refused call: already failed, its error goes back to the model
            tool = get_tool(step.tool)
            if (
                tool.commits_before_call
                or operations.gated(self.state.run, tool)
                or needs_approval(self.state.run, tool, step.arguments)
            ):
                break  # order matters: nothing after a side effect runs ahead of it
            head.append(step)
        return head

    def _run_eager_prefix(self, head: list[Step], in_txn: bool) -> list[tuple[Step, StepAttempt]]:
        done = []
        for position, step in enumerate(head):
            tool = get_tool(step.tool)
            started = timezone.now()
            failpoints.hit("step_started", tool=step.tool, step_id=step.id)
            ctx = ToolContext(
                run=self.state.run, step=step, attempt=1, idempotency_key=step.idempotency_key
            )
            try:
                result = call_tool(self.state.run, step, tool, ctx)
            except Exception as exc:
                if is_infrastructure_error(exc):
                    raise  # weather: the whole model commit stops, nothing is recorded
                if in_txn:  # its writes (or a broken transaction) must go: roll back, run less
                    raise EagerCallFailed(position) from exc
                break  # leave it pending: the normal path runs it with its retry policy
            failpoints.hit("tool_returned", tool=step.tool, step_id=step.id)
            now = timezone.now()
            step.status, step.result, step.attempts = StepStatus.SUCCEEDED, result, 1
            step.started_at, step.finished_at = started, now
            row = self._attempt_row(
                step, 1, started, finished_at=now, outcome=AttemptOutcome.SUCCEEDED
            )
            done.append((step, row))
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
            if (
                not tool.commits_before_call
                or operations.gated(self.state.run, tool)  # its gate opens its own "before"
                or needs_approval(self.state.run, tool, step.arguments)
            ):
                return []
            step.status, step.attempts, step.started_at = StepStatus.RUNNING, 1, now
            self.state.begun_here.add(step.id)
            return [self._attempt_row(step, 1, now)]
        return []

    def _attempt_row(self, step: Step, number: int, started: Any, **values: Any) -> StepAttempt:
        """A new attempt row of `step` by this executor (for a WriteBatch)."""
        return build(
            StepAttempt,
            {"step": step},
            step_id=step.id,
            number=number,
            worker=self.owner,
            started_at=started,
            **values,
        )

    @staticmethod
    def _end_attempt(batch: WriteBatch, step: Step, number: int, **values: Any) -> None:
        """Into `batch`: the update of attempt `number` of `step` with `values` (how it ended)."""
        row = build(StepAttempt, step_id=step.id, number=number, **values)
        batch.update(row, list(values), where={"step": step.id, "number": number})

    def _plan_tool_steps(self, calls: list[ToolCall], now: Any) -> list[Step]:
        """Tool calls become rows in the commit that records the model response (invariant 3).
        Bad calls (unknown tool, outside the snapshot, bad JSON, schema) are failed steps whose
        error goes back to the model (invariant 7)."""
        planned = []
        for call in calls:
            step_id = uuid.uuid4()
            step = build(
                Step,
                id=step_id,
                run_id=self.run_id,
                index=len(self.state.steps),
                kind=StepKind.TOOL,
                tool=call.name[:100],
                call_id=call.id[:100],
                idempotency_key=step_key(self.run_id, step_id),
            )
            try:
                step.arguments = self._validated_arguments(call)
            except (ToolArgumentsError, UnknownTool) as exc:
                step.status = StepStatus.FAILED
                step.error = storable_text(str(exc))
                step.finished_at = now
            self.state.steps.append(step)
            planned.append(step)
        return planned

    def _validated_arguments(self, call: ToolCall) -> dict:
        if not self.state.run.tool_allowed(call.name):
            raise UnknownTool(refused_message(self.state.run, call.name))
        try:
            # strict: a NaN, a 5000-digit number or a NUL could not be stored as the arguments
            arguments = loads_strict(call.arguments or "{}", "arguments", repair_text=True)
        except UnsafeValue as exc:
            problem = str(exc).removeprefix("malformed JSON: ")
            raise ToolArgumentsError(
                f"{call.name}: arguments are not valid JSON ({problem})"
            ) from None
        return get_tool(call.name).validate(arguments)
