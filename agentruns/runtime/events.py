"""What a run's timeline says: the event types and the payloads the runtime writes.

Events are appended by the store (`runtime/store`) in the transaction of the change they
describe, with seqs allocated from `Run.last_seq` (no holes, no duplicates). The stream, the
run page, the API and the AI SDK chunks are all read from them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from agentruns.models import Run, RunEvent, Step
from agentruns.runtime.values.redaction import redact_fields, redact_text
from agentruns.runtime.values.timestamps import iso


class EventType(StrEnum):
    # the run
    RUN_CREATED = "run.created"
    RUN_STATUS = "run.status"  # data: status, and error / stop_reason / reason when it ends
    RUN_OUTPUT = "run.output"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_RETRIED = "run.retried"
    RUN_FORKED = "run.forked"
    # model turns
    MODEL_DELTA = "model.delta"  # data: step, attempt, text
    MODEL_SUPERSEDED = "model.superseded"  # that attempt's streamed text is void
    # steps (data: step_event_data)
    STEP_PLANNED = "step.planned"
    STEP_STARTED = "step.started"
    STEP_SUCCEEDED = "step.succeeded"
    STEP_FAILED = "step.failed"
    STEP_RETRY_SCHEDULED = "step.retry_scheduled"
    STEP_RETRY_REQUESTED = "step.retry_requested"
    STEP_RECOVERED = "step.recovered"
    STEP_UNKNOWN = "step.unknown"
    STEP_WAITING_APPROVAL = "step.waiting_approval"
    STEP_RESOLVED = "step.resolved"
    STEP_SKIPPED = "step.skipped"  # a retry skipped it (its outcome unknown): never made again
    # the inbox
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_GIVEN = "approval.given"  # one of several approvals: the item is still pending
    APPROVAL_DECIDED = "approval.decided"
    APPROVAL_WITHDRAWN = "approval.withdrawn"
    APPROVAL_ESCALATED = "approval.escalated"  # waited past its due time
    # across runs: a lead allowed one more execution of an operation key (data: key, slot, by)
    OPERATION_ALLOWED = "operation.allowed"


# (type, data): what the store appends
EventSpec = tuple[str, dict]


class LeaseLost(Exception):
    """The run's lease moved to another worker: stop without writing anything more."""


def step_event_data(step: Step, **extra: Any) -> dict:
    """The payload of every step.* event: which step, its state, its attempts so far, its error.
    `step.started` and `step.waiting_approval` pass `error=""`: an attempt that begins (or a
    call that waits for a person) has no error of its own, while the step's row still holds the
    previous attempt's after a retry."""
    return {
        "step": step.index,
        "id": str(step.id),
        "kind": step.kind,
        "tool": step.tool,
        "status": step.status,
        "attempts": step.attempts,
        "error": redact_text(step.error),  # events are for people: no credential in them
        **extra,
    }


def planned_event_data(run: Run, step: Step) -> dict:
    """`step.planned` of a tool call: its arguments as the model asked for them (redacted), so
    the AI SDK stream (`stream/ui_chunks.py`) can show the call from the events alone."""
    return step_event_data(
        step,
        status="pending",
        arguments=redact_fields(step.arguments, run.redacted_fields(step.tool)),
    )


def succeeded_event_data(run: Run, step: Step) -> dict:
    """`step.succeeded` of a tool call: with its result (redacted), for the same reason."""
    return step_event_data(step, result=redact_fields(step.result, run.redacted_fields(step.tool)))


def event_payload(event: RunEvent) -> dict:
    """An event as the API and the stream's frames carry it."""
    return {
        "seq": event.seq,
        "type": event.type,
        "data": event.data,
        "created_at": iso(event.created_at),
    }
