"""JSON schemas of what the API answers (the OpenAPI description's response bodies).

`tests/api/test_openapi.py` validates real answers against them, and the schemathesis run checks
every operation's answers against the served description, so a payload that changes without its
schema fails the suite. Objects allow extra properties: adding a field is not a breaking change.
"""

from __future__ import annotations

from agentruns.models import PRIORITY_MAX, PRIORITY_MIN, RunStatus, StepKind, StepStatus, WaitKind

TIME = {"type": "string", "format": "date-time"}
TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
TEXT_OR_NULL = {"type": ["string", "null"]}
COUNT = {"type": "integer", "minimum": 0}
ANY_JSON: dict = {}


def obj(properties: dict, *, optional: tuple[str, ...] = ()) -> dict:
    """An object with these properties, all required except `optional`."""
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
    }


PRIORITY = {
    "type": "integer",
    "minimum": PRIORITY_MIN,
    "maximum": PRIORITY_MAX,
    "description": "higher is claimed first among queued runs (default 0)",
}
# a run's place among queued runs: its priority, and, waiting in its concurrency key's line,
# the run it waits behind with the reason as a person reads it
QUEUE_FIELDS = {
    "priority": PRIORITY,
    "concurrency_key": TEXT_OR_NULL,
    "waiting_behind": {"type": ["string", "null"], "format": "uuid"},
    "waiting_reason": TEXT_OR_NULL,
}
# what a waiting run waits for (selectors/waiting.py); null unless it is waiting
WAITING_FOR = {
    "anyOf": [
        obj(
            {
                "kind": {"type": "string", "enum": list(WaitKind.values)},
                "since": TIME_OR_NULL,
                "due": TIME_OR_NULL,
                "token": TEXT_OR_NULL,
            }
        ),
        {"type": "null"},
    ]
}
QUEUE_FIELDS["waiting_for"] = WAITING_FOR
USAGE = obj({"prompt_tokens": COUNT, "completion_tokens": COUNT})
STEP = obj(
    {
        "id": {"type": "string", "format": "uuid"},
        "index": COUNT,
        "kind": {"type": "string", "enum": StepKind.values},
        "tool": TEXT_OR_NULL,
        "status": {"type": "string", "enum": StepStatus.values},
        "attempts": COUNT,
        "idempotency_key": {"type": "string"},
        "arguments": ANY_JSON,
        "result": ANY_JSON,
        "error": TEXT_OR_NULL,
        "text": TEXT_OR_NULL,
        "usage": {"anyOf": [USAGE, {"type": "null"}]},
        "next_attempt_at": TIME_OR_NULL,
        "started_at": TIME_OR_NULL,
        "finished_at": TIME_OR_NULL,
    }
)
RUN = obj(
    {
        "id": {"type": "string", "format": "uuid"},
        "agent": {"type": "string"},
        "status": {"type": "string", "enum": RunStatus.values},
        "input": {"type": "object"},
        "dedupe_key": TEXT_OR_NULL,
        "scope": {"type": ["string", "integer", "null"]},
        "model": {"type": "string"},
        # the final text, or a structured output_type's validated object (any JSON value)
        "output": {"type": ["string", "object", "array", "number", "integer", "boolean"]},
        "error": TEXT_OR_NULL,
        "stop_reason": TEXT_OR_NULL,
        # what the work came to, when it ended (its agent's declaration; null: none)
        "outcome": TEXT_OR_NULL,
        "step_count": COUNT,
        "usage": obj(
            {
                "prompt_tokens": COUNT,
                "completion_tokens": COUNT,
                "total_tokens": COUNT,
                "cost_usd": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"},
            }
        ),
        "cancel_requested": {"type": "boolean"},
        "created_at": TIME,
        "started_at": TIME_OR_NULL,
        "finished_at": TIME_OR_NULL,
        "last_seq": COUNT,
        **QUEUE_FIELDS,
        "steps": {"type": "array", "items": STEP},
    },
    optional=("steps",),
)
RUN_WITH_STEPS = {**RUN, "required": [*RUN["required"], "steps"]}
FORK_PLAN = obj(
    {
        "run_id": {"type": "string", "format": "uuid"},
        "from_step": COUNT,
        "approve_repeats": {"type": "boolean"},
        "repeats": {
            "type": "array",
            "items": obj(
                {
                    "index": COUNT,
                    "tool": {"type": "string"},
                    "status": {"type": "string", "enum": StepStatus.values},
                    "idempotency": {"type": "string", "enum": ["key", "none", "transaction"]},
                    "outcome_unknown": {"type": "boolean"},
                    "approval": {"type": "boolean"},
                }
            ),
        },
        "approval_for": {"type": "array", "items": {"type": "string"}},
    }
)
CURSOR_OR_NULL = {"type": ["string", "null"]}
RUN_SUMMARY = obj(
    {
        "id": {"type": "string", "format": "uuid"},
        "agent": {"type": "string"},
        "status": {"type": "string", "enum": RunStatus.values},
        "error": TEXT_OR_NULL,
        "stop_reason": TEXT_OR_NULL,
        # what the work came to, when it ended (its agent's declaration; null: none)
        "outcome": TEXT_OR_NULL,
        "step_count": COUNT,
        "cancel_requested": {"type": "boolean"},
        "worker": TEXT_OR_NULL,
        "created_by": TEXT_OR_NULL,
        "trace_id": TEXT_OR_NULL,
        "created_at": TIME,
        "finished_at": TIME_OR_NULL,
        **QUEUE_FIELDS,
    }
)
RUN_LIST = obj(
    {
        "runs": {"type": "array", "items": RUN_SUMMARY},
        "next": CURSOR_OR_NULL,
        "newer": CURSOR_OR_NULL,
    }
)
EVENT = obj(
    {"seq": COUNT, "type": {"type": "string"}, "data": {"type": "object"}, "created_at": TIME}
)
EVENTS = obj({"events": {"type": "array", "items": EVENT}, "last_seq": COUNT})

# W3C trace context: the run's trace continues the caller's. Any string is accepted: the W3C
# spec says an invalid one is ignored (a new trace starts), never a reason to refuse the call
TRACEPARENT = {
    "type": "string",
    "description": "W3C traceparent; the run's trace continues it (an invalid one is ignored)",
}
