"""Reads for the API: runs, steps and events as JSON, with redaction applied."""

from __future__ import annotations

from agentruns.models import Run, Step
from agentruns.runtime.values.redaction import redact_fields, redact_text
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors import waiting_line
from agentruns.selectors.waiting import waiting_for


def step_payload(run: Run, step: Step) -> dict:
    hidden = run.redacted_fields(step.tool)
    return {
        "id": str(step.id),
        "index": step.index,
        "kind": step.kind,
        "tool": step.tool or None,
        "status": step.status,
        "attempts": step.attempts,
        "idempotency_key": step.idempotency_key,
        "arguments": redact_fields(step.arguments, hidden),
        "result": redact_fields(step.result, hidden),
        "error": redact_text(step.error) or None,
        "text": step.text if step.kind == "model" else None,
        "usage": {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens}
        if step.kind == "model"
        else None,
        "next_attempt_at": iso(step.next_attempt_at),
        "started_at": iso(step.started_at),
        "finished_at": iso(step.finished_at),
    }


def permissions_payload(run: Run) -> dict:
    """The permission snapshot frozen at start; runs from before snapshots had every tool."""
    if run.permissions:
        return run.permissions
    return {
        "user": run.created_by.get_username() if run.created_by_id else None,
        "groups": [],
        "tools": {name: {"allowed": True, "approval": "tool"} for name in run.tool_snapshot},
    }


def queue_fields(run: Run) -> dict:
    """Its priority, and for a run waiting in its concurrency key's line the run it waits behind
    and why, as a line a person reads."""
    return {
        "priority": run.priority,
        "concurrency_key": run.concurrency_key,
        "waiting_behind": str(run.waiting_behind) if run.waiting_behind else None,
        "waiting_reason": waiting_line(run) or None,
        "waiting_for": waiting_for(run),
    }


def run_summary_payload(run: Run) -> dict:
    """A run in the list (`GET /api/runs`): what the runs page shows, no input or steps."""
    return {
        "id": str(run.id),
        "agent": run.agent,
        "status": run.status,
        "error": redact_text(run.error) or None,
        "stop_reason": run.stop_reason or None,
        "outcome": run.outcome or None,
        "step_count": run.step_count,
        "cancel_requested": run.cancel_requested,
        "worker": run.worker or None,
        "created_by": run.created_by.get_username() if run.created_by_id else None,
        "trace_id": run.trace_id or None,
        "created_at": iso(run.created_at),
        "finished_at": iso(run.finished_at),
        **queue_fields(run),
    }


def run_payload(run: Run, steps: list[Step] | None = None) -> dict:
    data = {
        "id": str(run.id),
        "agent": run.agent,
        "status": run.status,
        "input": run.input,
        "dedupe_key": run.dedupe_key,
        # what the run is about (its agent's `scope` of its input): its tools act on it alone
        "scope": run.scope,
        "model": run.model,
        # a structured output_type's validated object, else the final text
        "output": run.output_data if run.output_data is not None else run.output,
        "error": redact_text(run.error) or None,
        "stop_reason": run.stop_reason or None,
        "outcome": run.outcome or None,
        "step_count": run.step_count,
        "usage": {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "total_tokens": run.total_tokens,
            "cost_usd": str(run.cost_usd),
        },
        "cancel_requested": run.cancel_requested,
        # the worker process ("host:pid") executing a running run
        "worker": run.worker or None,
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "last_seq": run.last_seq,
        "trace_id": run.trace_id or None,
        "permissions": permissions_payload(run),
        **queue_fields(run),
    }
    if steps is not None:
        data["steps"] = [step_payload(run, s) for s in steps]
    return data
