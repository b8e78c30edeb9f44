"""The run's long spans: its root, its worker slices, a slice lost with its worker, a park."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from agentruns.models import Run, RunEvent, StepAttempt
from agentruns.runtime.tracing.sdk import (
    SLICE_SPAN,
    TERMINAL,
    attach,
    detach,
    enabled,
    fail_span,
    model_names,
    remote_parent,
    root_context,
    run_attributes,
    start_span,
)
from agentruns.runtime.tracing.tracecontext import (
    parse_traceparent,
    root_span_id,
    slice_span_id,
)

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ the run and its slices
class RunSlice:
    """The live `advance_run` span of one executor, current while it drives the run."""

    def __init__(self, state: Any, run: Run) -> None:
        self.run, self.state = run, state
        self.lost_owners: set[str] = set()
        self.span = start_span(
            f"advance_run {run.agent}",
            root_context(run),
            span_id=slice_span_id(run.id, state.owner),
            attributes={**run_attributes(run), "agentruns.worker": state.owner},
        )
        self.token = attach(self.span)
        self.slice_token = SLICE_SPAN.set(self)

    def end(self, outcome: str) -> Callable[[], None] | None:
        """Ends the slice's span (in the task that began it); returns the root span's emission
        when the run ended (blocking work: it may read the run), else None."""
        self.span.set_attribute("agentruns.slice.outcome", outcome)
        if outcome == "lease_lost":
            fail_span(self.span, "the lease was lost; another worker continues")
        SLICE_SPAN.reset(self.slice_token)
        detach(self.token)
        self.span.end()
        run = self.run
        if outcome == "succeeded":  # all it needs is in memory: no query on the common path
            steps = len(self.state.steps)
            return lambda: _emit_safely(run.id, run, "succeeded", steps=steps)
        if outcome in TERMINAL:  # the error and stop reason were written by the final commit
            return lambda: _emit_safely(run.id)
        return None


def sliced(advance: Any) -> Any:
    """Decorates the executor's `advance_in` (a coroutine): the slice `_drive` began ends with
    its outcome, the root span's emission on the slice's lane."""

    @functools.wraps(advance)
    async def traced(executor: Any, lane: Any, *args: Any, **kwargs: Any) -> str:
        outcome = "error"
        try:
            outcome = await advance(executor, lane, *args, **kwargs)
            return outcome
        finally:
            state = executor.state
            emit = end_slice(state.trace_slice if state is not None else None, outcome)
            if emit is not None:
                await lane.run(emit)

    return traced


def begin_slice(state: Any, run: Run) -> RunSlice | None:
    """Called once the executor has loaded its run; None (and nothing else) when tracing is off."""
    if not enabled() or not run.trace_id:
        return None
    try:
        return RunSlice(state, run)
    except Exception:  # tracing must never stop a run
        log.warning("could not start the slice span of run %s", state.run_id, exc_info=True)
        return None


def end_slice(trace_slice: RunSlice | None, outcome: str) -> Callable[[], None] | None:
    if trace_slice is None:
        return None
    try:
        return trace_slice.end(outcome)
    except Exception:
        log.warning("could not end the slice span of run %s", trace_slice.run.id, exc_info=True)
        return None


def run_ended_on_commit(run_id: uuid.UUID) -> None:
    """A run ended outside any executor (cancelled while parked or abandoned): its root span."""
    if enabled():
        transaction.on_commit(lambda: _emit_safely(run_id))


def _emit_safely(run_id: uuid.UUID, run: Run | None = None, status: str = "", **known: Any) -> None:
    try:
        if run is None:
            emit_run_span(run_id)
        else:
            _emit_root(run, status, steps=known["steps"])
    except Exception:
        log.warning("could not emit the root span of run %s", run_id, exc_info=True)


def emit_run_span(run_id: uuid.UUID) -> None:
    """The root span, built at the run's end from what is stored: its start, its outcome."""
    run = Run.objects.only(
        "id", "agent", "model", "status", "error", "stop_reason", "trace_id", "trace_parent",
        "created_at", "finished_at", "prompt_tokens", "completion_tokens", "step_count",
    ).get(id=run_id)  # fmt: skip
    _emit_root(run, run.status, steps=run.step_count, error=run.error, stop_reason=run.stop_reason)


def _emit_root(
    run: Run, status: str, *, steps: int, error: str = "", stop_reason: str = ""
) -> None:
    if not run.trace_id:
        return
    parsed = parse_traceparent(run.trace_parent)
    parent = remote_parent(parsed[0], int(parsed[1], 16), parsed[2]) if parsed else None
    provider, model = model_names(run.model or "")
    span = start_span(
        f"invoke_agent {run.agent}",
        parent,
        start=run.created_at,
        span_id=root_span_id(run.id),
        trace_id=int(run.trace_id, 16),
        attributes={
            **run_attributes(run),
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": run.prompt_tokens,
            "gen_ai.usage.output_tokens": run.completion_tokens,
            "agentruns.run.status": status,
            "agentruns.run.steps": steps,
            "agentruns.run.stop_reason": stop_reason,
        },
    )
    if status == "failed":
        fail_span(span, error or stop_reason)
    span.end()  # now: after the last slice, which ends once the run's final commit is made


def worker_lost(state: Any, step: Any) -> None:
    """`step` was left running by a dead executor: emit that executor's slice, ended now, so its
    already-exported children hang under it and the crash shows as two slices of one trace."""
    trace_slice = state.trace_slice
    if trace_slice is None:
        return
    try:
        row = StepAttempt.objects.filter(step_id=step.id, number=step.attempts).first()
        dead = row.worker if row is not None else ""
        if not dead or dead == state.owner or dead in trace_slice.lost_owners:
            return
        trace_slice.lost_owners.add(dead)
        first = (
            StepAttempt.objects.filter(step__run_id=state.run_id, worker=dead)
            .order_by("started_at")
            .values_list("started_at", flat=True)
            .first()
        )
        run = state.run
        span = start_span(
            f"advance_run {run.agent}",
            root_context(run),
            start=first or row.started_at,
            span_id=slice_span_id(run.id, dead),
            attributes={
                **run_attributes(run),
                "agentruns.worker": dead,
                "agentruns.slice.outcome": "worker_lost",
                "agentruns.slice.recovered_by": state.owner,
            },
        )
        fail_span(span, "the worker died mid-step; its lease lapsed and another worker resumed")
        span.end()
    except Exception:
        log.warning("could not emit the lost slice of run %s", state.run_id, exc_info=True)


# ------------------------------------------------------------------ the park
def approvals_decided(run_id: uuid.UUID | str, events: list[tuple[str, dict]]) -> None:
    """A decision resumed (or settled) a parked run: its `await_approval` span, on commit."""
    if not enabled():
        return
    decided = [data for kind, data in events if kind == "approval.decided"]
    if decided:
        transaction.on_commit(lambda: _emit_await_approval(uuid.UUID(str(run_id)), decided))


def _emit_await_approval(run_id: uuid.UUID, decided: list[dict]) -> None:
    try:
        run = Run.objects.only("id", "agent", "trace_id", "trace_parent").get(id=run_id)
        if not run.trace_id:
            return
        for data in decided:
            parked_at = (
                RunEvent.objects.filter(
                    run_id=run_id, type="approval.requested", data__step=data.get("step")
                )
                .order_by("-seq")
                .values_list("created_at", flat=True)
                .first()
            )
            span = start_span(
                f"await_approval {data.get('tool') or ''}".strip(),
                root_context(run),
                start=parked_at,
                attributes={
                    **run_attributes(run),
                    "agentruns.approval.id": data.get("approval") or 0,
                    "agentruns.approval.kind": data.get("kind") or "",
                    "agentruns.approval.decision": data.get("decision") or "",
                    "agentruns.approval.decided_by": data.get("by") or "",
                    "agentruns.step.index": data.get("step") or 0,
                    "gen_ai.tool.name": data.get("tool") or "",
                },
            )
            span.end()
    except Exception:
        log.warning("could not emit the approval span of run %s", run_id, exc_info=True)
