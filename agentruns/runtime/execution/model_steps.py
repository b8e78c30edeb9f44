"""Model steps of the executor: stream a turn, persist it with the plan it asked for."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, RunStatus, Step, StepAttempt, StepKind, StepStatus
from agentruns.registry import get_tool
from agentruns.runtime import outcomes, tracing
from agentruns.runtime.access import model_limits
from agentruns.runtime.dispatch import connections
from agentruns.runtime.events import (
    EventType,
    planned_event_data,
    step_event_data,
    succeeded_event_data,
)
from agentruns.runtime.execution import failpoints, transitions
from agentruns.runtime.execution.delta_writer import DeltaFeed, delta_writer
from agentruns.runtime.execution.planned_steps import EagerCallFailed, PlannedSteps
from agentruns.runtime.outages import process_health
from agentruns.runtime.outages.model_outage import ModelOutage
from agentruns.runtime.providers import ModelError, ModelRequest, TextDelta, ToolCall, Usage
from agentruns.runtime.providers.base import TextSink
from agentruns.runtime.providers.costs import model_cost_usd
from agentruns.runtime.store.rows import WriteBatch, build
from agentruns.runtime.values.ids import step_key
from agentruns.runtime.values.redaction import redact_text
from agentruns.runtime.values.text import storable, storable_text

# a turn's first text is shown at once after this long a silence (an instant model batches)
FIRST_DELTA_AFTER_S = 0.005
MODEL_STEP_FIELDS = [
    "status",
    "text",
    "tool_calls",
    "prompt_tokens",
    "completion_tokens",
    "finished_at",
    "error",
]


@dataclass(slots=True)
class ModelAnswer:
    """What one attempt of a model step streamed back: what its commit records."""

    step: Step
    attempt: int
    started: datetime
    text: str
    tail: str  # the end of `text` that no delta event carries yet
    calls: list[ToolCall]
    usage: Usage


class RunFailed(Exception):
    """The run cannot go on (the model keeps failing): it ends as failed with this message."""


class ModelSteps(PlannedSteps):
    """Mixin of RunExecutor: the host and the slice state it relies on are `slice_state.py`."""

    def model_turn(self, step: Step | None) -> str | None:
        """One model step; returns the run's final status when the answer finished the run."""
        if step is None:
            index = len(self.state.steps)
            step_id = uuid.uuid4()
            step = build(
                Step,
                id=step_id,
                run_id=self.run_id,
                index=index,
                kind=StepKind.MODEL,
                idempotency_key=step_key(self.run_id, step_id),
                status=StepStatus.RUNNING,
            )
            self.state.steps.append(step)
        messages = self.state.conversation.extend(self.state.steps[: step.index])
        outage: ModelOutage | None = None
        while (waited := model_limits.wait_for_slot(self, messages)) is None:
            attempt = step.attempts + 1
            try:
                return self._stream_model(step, attempt, messages)
            except ModelError as exc:
                # an attempt that streamed text is one (its text is superseded); a call that
                # failed before any text is an outage, not an attempt (model_outage.py)
                streamed = not self._attempt_is_new(step, attempt)
                if not exc.retryable or (streamed and attempt >= conf.MODEL_MAX_ATTEMPTS):
                    self._record_model_failure(step, attempt, exc, final=True)
                    raise RunFailed(f"model error: {exc}") from exc
                if streamed:
                    self._record_model_failure(step, attempt, exc, final=False)
                outage = outage or ModelOutage.resume(self.run_id, step.index)
                wait = outage.failed(exc)
                if wait is None:  # down for AGENTRUNS_MODEL_OUTAGE_SECONDS: the step fails
                    verdict = outage.verdict(exc)
                    self._record_model_failure(step, step.attempts + 1, verdict, final=True)
                    raise RunFailed(f"model error: {verdict}") from exc
                if outcome := self._wait_out_model_outage(outage, exc, wait):
                    return outcome
        return waited  # backed off until its rate-limit slot, or cancelled while it waited

    def _wait_out_model_outage(
        self, outage: ModelOutage, exc: ModelError, wait: float
    ) -> str | None:
        """Back off before the next model call: queued with the reason and the next try (the
        thread and the lease go back) in a worker; a short wait, or in-process, sleeps here."""
        until = timezone.now() + timedelta(seconds=wait)
        if self.drain is not None and wait > conf.RETRY_SLEEP_MAX_SECONDS:
            return self.back_off(until, reason=outage.reason(exc), model_outage=outage.state())
        connections.release()
        if not self._wait_for_retry(until):
            return self.finish(
                RunStatus.CANCELLED, stop_reason="cancelled", error="cancelled on request"
            )
        return None

    def _stream_model(self, step: Step, attempt: int, messages: list[dict]) -> str | None:
        started = timezone.now()
        request = ModelRequest(
            model=self.state.run.model,
            messages=messages,
            tools=self.state.tool_schemas,
            agent=self.state.agent,
        )
        flush_s = conf.DELTA_FLUSH_MS / 1000.0
        flush_chars = conf.DELTA_FLUSH_CHARS
        # a model that keeps us waiting: no database connection held while it does
        lends_connection = getattr(self.state.provider, "waits", True)
        text: list[str] = []
        pending = ""  # the text before the attempt's first flush
        calls: list[ToolCall] = []
        usage = Usage()
        last_flush = time.monotonic()
        # after the first flush, in a worker: the process's delta writer takes the text (`sink`)
        feed: DeltaFeed | None = None
        sink = TextSink()
        flushed = False
        if lends_connection:
            connections.release()
        chunks = self.state.provider.stream(request, sink=sink)
        try:
            for chunk in chunks:
                if isinstance(chunk, TextDelta):
                    piece = storable_text(chunk.text)  # a model may send NUL or lone surrogates
                    text.append(piece)
                    if feed is not None:
                        feed.add(piece)
                        self.check_lease()
                        continue
                    pending += piece
                    since = time.monotonic() - last_flush
                    if (
                        len(pending) >= flush_chars
                        or since >= flush_s
                        or (not flushed and since >= FIRST_DELTA_AFTER_S)
                    ):
                        self._flush_delta(step, attempt, pending, started)
                        pending, last_flush, flushed = "", time.monotonic(), True
                        failpoints.hit(
                            "model_streaming", tool=self.state.run.agent, step_id=step.id
                        )
                        if lends_connection:
                            connections.release()
                        if self.drain is not None:  # a worker: its runs' deltas go out together
                            feed = delta_writer().open(
                                self.run_id, self.owner, step.index, attempt, self._feed_committed
                            )
                            sink.take = self._feed_taker(feed, text)
                elif isinstance(chunk, ToolCall):
                    calls.append(chunk)
                elif isinstance(chunk, Usage):
                    usage = chunk
            if feed is not None:  # before our own commit: what the writer has not written yet
                closing, feed = feed, None
                pending = closing.close()
        finally:
            chunks.close()  # a stream left early: its task ends here, on this thread
            if feed is not None:  # the attempt failed: its text is superseded, its error stands
                feed.close(raise_failure=False)
        answer = ModelAnswer(step, attempt, started, "".join(text), pending, calls, usage)
        return self._complete_model_step(answer)

    def _feed_taker(self, feed: DeltaFeed, text: list[str]) -> Callable[[str], None]:
        """`sink.take` once `feed` is open: called inside the provider's stream (no database)."""

        def take(delta: str) -> None:
            text.append(piece := storable_text(delta))
            feed.add(piece)
            self.check_lease()

        return take

    def _feed_committed(self, cancel_requested: bool) -> None:
        """The delta writer committed this attempt's text (which renewed the lease)."""
        self.cancel_requested = self.cancel_requested or cancel_requested
        if self.heartbeat is not None:
            self.heartbeat.renewed()

    def _begin_attempt(
        self,
        step: Step,
        attempt: int,
        started: Any,
        batch: WriteBatch,
        *,
        update_fields: list[str] = (),
        **attempt_values: Any,
    ) -> None:
        """Into `batch`: the step on its attempt `attempt` (first time: its insert, otherwise an
        update of `update_fields` as well) and that attempt's row (with `attempt_values`)."""
        step.attempts = attempt
        step.started_at = step.started_at or started
        if step._state.adding:
            batch.insert([step])
        else:  # a step a dead worker left behind, or one whose first attempt failed
            fields = dict.fromkeys([*update_fields, "status", "attempts", "started_at"])
            batch.update(step, list(fields))
        batch.insert([self._attempt_row(step, attempt, started, **attempt_values)])

    @staticmethod
    def _attempt_is_new(step: Step, attempt: int) -> bool:
        """No row of this attempt was written yet (nothing streamed by it)."""
        return step._state.adding or step.attempts < attempt

    def _flush_delta(self, step: Step, attempt: int, text: str, started: Any) -> None:
        """One commit: the streamed text (and, on the attempt's first flush, the step as running
        with its attempt row)."""
        events = []
        batch = None
        if self._attempt_is_new(step, attempt):
            batch = WriteBatch()
            step.status = StepStatus.RUNNING
            self._begin_attempt(step, attempt, started, batch)
            events.append((EventType.STEP_STARTED, step_event_data(step, error="")))
        events.append(
            (EventType.MODEL_DELTA, {"step": step.index, "attempt": attempt, "text": text})
        )
        self.commit(events, batch=batch)
        self.check_lease()

    def _complete_model_step(self, answer: ModelAnswer) -> str | None:
        now = timezone.now()
        planned = self._plan_tool_steps(answer.calls, now)
        # read-only and transactional calls at the head of the plan run now, recorded in the
        # model's commit (transactional ones inside it): if we die first, both are done again
        limit = len(planned)
        ends = not answer.calls and outcomes.hands_over(self.state.run.agent, self.state.steps)
        while True:
            head = self._eager_prefix(planned)[:limit]
            in_txn = ends or any(get_tool(s.tool).transactional for s in head)
            try:
                with transaction.atomic() if in_txn else nullcontext():
                    eager = self._run_eager_prefix(head, in_txn)
                    final, begun = self._commit_model_step(
                        answer, planned, eager, now=now, end_transaction=in_txn
                    )
                break
            except EagerCallFailed as failed:
                # rolled back with every eager call's writes: this time stop before the failed
                # call, which then runs on the normal path with its retry policy
                for eager_step in head:
                    eager_step.status, eager_step.result, eager_step.attempts = (
                        StepStatus.PENDING,
                        None,
                        0,
                    )
                    eager_step.started_at = eager_step.finished_at = None
                limit = failed.position
        for eager_step, _ in eager:
            failpoints.hit("step_persisted", tool=eager_step.tool, step_id=eager_step.id)
        for attempt_row in begun:
            failpoints.hit("step_started", tool=attempt_row.step.tool, step_id=attempt_row.step_id)
        return RunStatus.SUCCEEDED if final else None

    def _commit_model_step(
        self,
        answer: ModelAnswer,
        planned: list[Step],
        eager: list[tuple[Step, StepAttempt]],
        *,
        now: Any,
        end_transaction: bool,
    ) -> tuple[bool, list[StepAttempt]]:
        """One commit: the model step, its plan, the eager calls, and the finish if it answered.
        Returns (the run finished, the side-effect attempts begun in it)."""
        step, attempt, usage = answer.step, answer.attempt, answer.usage
        run = self.state.run
        events: list[tuple[str, dict]] = []
        batch = WriteBatch()
        step.status = StepStatus.SUCCEEDED
        step.text = answer.text
        step.tool_calls = storable(
            [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in answer.calls]
        )
        step.prompt_tokens, step.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        step.finished_at = now
        step.error = ""
        if self._attempt_is_new(step, attempt):  # nothing streamed by it: its rows go in now
            self._begin_attempt(
                step,
                attempt,
                answer.started,
                batch,
                update_fields=MODEL_STEP_FIELDS,
                finished_at=now,
                outcome=AttemptOutcome.SUCCEEDED,
            )
            events.append(
                (EventType.STEP_STARTED, step_event_data(step, status=StepStatus.RUNNING, error=""))
            )
        else:
            batch.update(step, MODEL_STEP_FIELDS)
            self._end_attempt(
                batch, step, attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED
            )
        if answer.tail:
            events.append(
                (
                    EventType.MODEL_DELTA,
                    {"step": step.index, "attempt": attempt, "text": answer.tail},
                )
            )
        events.append((EventType.STEP_SUCCEEDED, step_event_data(step)))
        begun = self._begin_next_side_effect(planned, eager, now)
        batch.insert(planned)
        batch.insert([row for _, row in eager] + begun)
        for planned_step in planned:
            events.append((EventType.STEP_PLANNED, planned_event_data(run, planned_step)))
            if planned_step.status == StepStatus.SUCCEEDED:
                events.append((EventType.STEP_SUCCEEDED, succeeded_event_data(run, planned_step)))
            elif planned_step.status == StepStatus.RUNNING:
                events.append((EventType.STEP_STARTED, step_event_data(planned_step)))
        run.prompt_tokens += usage.prompt_tokens
        run.completion_tokens += usage.completion_tokens
        cost = model_cost_usd(run.model or conf.MODEL, usage)
        run.cost_usd = Decimal(run.cost_usd) + cost
        fields: dict[str, Any] = {"step_count": len(self.state.steps)}
        final = not answer.calls  # the answer: finish the run in this same commit
        if final:
            steps, text = self.state.steps, answer.text
            done = transitions.ended(run, RunStatus.SUCCEEDED, steps=steps, output=text)
            events.extend(done.events)
            fields.update(done.fields)
        self.commit(
            events,
            batch=batch,
            end_transaction=end_transaction,
            set_fields=fields,
            incr_fields={
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cost_usd": cost,
            },
        )
        return final, begun

    def _record_model_failure(
        self, step: Step, attempt: int, exc: ModelError, *, final: bool
    ) -> None:
        now = timezone.now()
        error = redact_text(storable_text(str(exc)))
        process_health.model_error(exc)
        tracing.model_attempt_failed(attempt, exc, final=final)
        # deltas of this attempt were already flushed: a retry must not merge with them
        streamed = not self._attempt_is_new(step, attempt)
        step.error = error
        step.status = StepStatus.FAILED if final else StepStatus.RUNNING
        if final:
            step.finished_at = now
        ended = {
            "finished_at": now,
            "outcome": AttemptOutcome.FAILED if final else AttemptOutcome.RETRYING,
            "error": error,
        }
        batch = WriteBatch()
        if streamed:
            batch.update(step, ["error", "status", "finished_at"])
            self._end_attempt(batch, step, attempt, **ended)
        else:
            self._begin_attempt(
                step, attempt, now, batch, update_fields=["error", "finished_at"], **ended
            )
        etype = EventType.STEP_FAILED if final else EventType.STEP_RETRY_SCHEDULED
        events = [(etype, step_event_data(step))]
        if streamed and not final:  # the next attempt re-streams the turn from scratch
            events.append((EventType.MODEL_SUPERSEDED, {"step": step.index, "attempt": attempt}))
        self.commit(events, batch=batch)
