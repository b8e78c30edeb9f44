"""The JSON API for runs and their events (DESIGN.md 6): services write, selectors read."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from agentruns import selectors, services
from agentruns.api.conversations.threads import THREAD_ID, start_thread
from agentruns.api.endpoint import RUN_ID, endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import EVENTS, FORK_PLAN, PRIORITY, RUN, RUN_WITH_STEPS, TRACEPARENT
from agentruns.api.serializers import run_payload
from agentruns.models import Run
from agentruns.registry import UnknownAgent
from agentruns.runtime.events import event_payload

VIEW = "agentruns.view_run"
OPERATE = "agentruns.operate_run"
START = "agentruns.start_run"
RUN_PATH = {"run_id": RUN_ID}
REASON = {"type": "string", "maxLength": 500}


def run_or_404(run_id: str) -> Run:
    run = selectors.get_run(run_id)
    if run is None:
        raise BadRequest("no such run", 404)
    return run


AGENT_MAX = Run._meta.get_field("agent").max_length
KEY_MAX = Run._meta.get_field("dedupe_key").max_length
IDEMPOTENCY_KEY = {"type": "string", "maxLength": KEY_MAX}


# the chat endpoint's runs (agentruns.api.chat): an API key never names one of them
CHAT_KEY_PREFIX = "chat:"


def idempotency_key(request: HttpRequest) -> str | None:
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and (len(key) > KEY_MAX or not key.isprintable()):
        raise BadRequest(f"Idempotency-Key must be at most {KEY_MAX} printable characters")
    if key is not None and key.startswith(CHAT_KEY_PREFIX):
        raise BadRequest(
            f'an Idempotency-Key may not begin with "{CHAT_KEY_PREFIX}": those name the runs '
            "of chats (POST /api/chat/<agent>)"
        )
    return key


@endpoint(
    "POST",
    "/runs",
    summary="Start a run (a repeated Idempotency-Key returns the same run)",
    permission=START,
    body={
        "agent": {"type": "string", "minLength": 1, "maxLength": AGENT_MAX},
        "input": {"type": "object"},
        "priority": PRIORITY,
        # the first run of a thread (a conversation: POST /api/threads/<id>/messages continues it)
        "thread": {"oneOf": [THREAD_ID, {"type": "boolean", "enum": [True]}]},
    },
    required=("agent",),
    responses={
        201: "created",
        200: "your run of this Idempotency-Key (a key is its starter's)",
        403: "no right to start runs, or to a priority above 0",
        409: '"thread": an id of another user\'s thread, or a message id of another sender',
    },
    tags=("runs",),
    returns=RUN_WITH_STEPS,
    headers={"Idempotency-Key": IDEMPOTENCY_KEY, "traceparent": TRACEPARENT},
    example={
        "agent": "refund",
        "input": {"order_id": "ORD-1001", "message": "The blender arrived broken, refund $15."},
    },
    provides={"run_id": "/id"},
)
def create_run(request: HttpRequest, body: dict) -> tuple[dict, int]:
    if "thread" in body:
        return start_thread(request, body)
    try:
        result = services.start_run(
            body["agent"],
            body.get("input", {}),
            dedupe_key=idempotency_key(request),
            user=request.user,
            traceparent=request.headers.get("traceparent"),
            priority=body.get("priority", 0),
        )
    except UnknownAgent as exc:
        raise BadRequest(str(exc)) from None
    except ValueError as exc:
        raise BadRequest(f"invalid input: {exc}") from None
    return run_payload(result.run, []), 201 if result.created else 200


@endpoint(
    "GET",
    "/runs/{run_id}",
    summary="A run with its steps",
    permission=VIEW,
    path_params=RUN_PATH,
    tags=("runs",),
    returns=RUN_WITH_STEPS,
)
def run_detail(request: HttpRequest, run_id: str) -> dict:
    run = run_or_404(run_id)
    return run_payload(run, selectors.run_steps(run))


@endpoint(
    "GET",
    "/runs/{run_id}/events",
    summary="A run's events after a seq, in seq order",
    permission=VIEW,
    path_params=RUN_PATH,
    query={
        "after": {"type": "integer", "minimum": 0},
        "limit": {"type": "integer", "minimum": 1, "maximum": 5000},
    },
    tags=("runs",),
    returns=EVENTS,
)
def run_events(request: HttpRequest, run_id: str, after: int = 0, limit: int = 1000) -> dict:
    run = run_or_404(run_id)
    events = selectors.events_after(run.id, after, limit)
    return {"events": [event_payload(e) for e in events], "last_seq": run.last_seq}


def _operated(run: Run) -> dict[str, Any]:
    run.refresh_from_db()
    return run_payload(run)


@endpoint(
    "POST",
    "/runs/{run_id}/cancel",
    summary="Cancel a run (at the next step boundary if running)",
    permission=OPERATE,
    path_params=RUN_PATH,
    body={"reason": REASON},
    responses={200: "OK", 409: "refused"},
    tags=("runs",),
    returns=RUN,
)
def cancel_run(request: HttpRequest, run_id: str, body: dict) -> dict:
    run = run_or_404(run_id)
    return _operated(services.cancel_run(run.id, user=request.user, reason=body.get("reason", "")))


STOP_RESPONSES = {
    200: "OK: stopping (a model turn in flight ends within a second)",
    403: "neither its starter nor an operator",
    404: "no such run",
    409: "the run already ended",
    429: "too many stops by this user (Retry-After)",
}


def stopped(request: HttpRequest, run: Run, reason: str) -> dict[str, Any]:
    """Stop `run` for the caller: its starter or an operator (`services.may_stop`), else 403;
    every ask counts against the caller's stops (429 with Retry-After over them)."""
    return _operated(services.stop_for(run.id, user=request.user, reason=reason))


@endpoint(
    "POST",
    "/runs/{run_id}/stop",
    summary="Stop a run now: its model turn ends within a second, keeping its text so far",
    path_params=RUN_PATH,
    body={"reason": REASON},
    session_writes=True,
    responses=STOP_RESPONSES,
    tags=("runs",),
    returns=RUN,
)
def stop_run(request: HttpRequest, run_id: str, body: dict) -> dict:
    """Its starter, or anyone with `agentruns.operate_run`. A tool call in flight finishes
    first; the run ends `cancelled` with the stop reason "stopped" (a second stop is no error)."""
    return stopped(request, run_or_404(run_id), body.get("reason", ""))


@endpoint(
    "POST",
    "/runs/{run_id}/retry",
    summary="Retry a failed run from its failed step (same idempotency key)",
    permission=OPERATE,
    path_params=RUN_PATH,
    body={},
    responses={200: "OK", 409: "refused"},
    tags=("runs",),
    returns=RUN,
)
def retry_run(request: HttpRequest, run_id: str, body: dict) -> dict:
    return _operated(services.retry_run(run_or_404(run_id).id, user=request.user))


FROM_STEP = {"type": "integer", "minimum": 0, "maximum": 100_000}
APPROVE_REPEATS = {"type": "boolean"}


@endpoint(
    "GET",
    "/runs/{run_id}/fork",
    summary="What a fork from a model step would repeat: the source's side effects at and "
    "after the cut, and which of them wait for approval in the fork",
    permission=OPERATE,  # the fork's confirmation, as on the run page
    path_params=RUN_PATH,
    query={"from_step": FROM_STEP, "approve_repeats": APPROVE_REPEATS},
    responses={200: "the fork's plan", 409: "this step cannot be forked from"},
    tags=("runs",),
    returns=FORK_PLAN,
)
def fork_preview(
    request: HttpRequest, run_id: str, from_step: int | None = None, approve_repeats: bool = True
) -> dict:
    if from_step is None:
        raise BadRequest("from_step is required: the index of a model step")
    source = run_or_404(run_id)
    return services.fork_plan(source, from_step, approve_repeats=approve_repeats).payload()


@endpoint(
    "POST",
    "/runs/{run_id}/fork",
    summary="A new run with this one's history before a model step (needs start_run too); the "
    "source's side effects at and after the cut wait for approval unless approve_repeats is false",
    permission=OPERATE,
    path_params=RUN_PATH,
    body={"from_step": FROM_STEP, "approve_repeats": APPROVE_REPEATS},
    required=("from_step",),
    responses={201: "the new run, with its plan", 403: "no right to start runs", 409: "refused"},
    tags=("runs",),
    returns=RUN_WITH_STEPS,
    provides={"run_id": "/id"},
)
def fork_run(request: HttpRequest, run_id: str, body: dict) -> tuple[dict, int]:
    source, approve_repeats = run_or_404(run_id), body.get("approve_repeats", True)
    fork = services.fork_run(
        source.id, body["from_step"], user=request.user, approve_repeats=approve_repeats
    )
    payload = run_payload(fork, selectors.run_steps(fork))
    # what the confirmation listed: the source's side effects the fork may repeat
    payload["fork"] = services.fork_plan(
        source, body["from_step"], approve_repeats=approve_repeats
    ).payload()
    return payload, 201


@endpoint(
    "POST",
    "/runs/{run_id}/steps/{index}/resolve",
    summary="A failed side-effect step was done by hand: record its result, the run continues",
    permission=OPERATE,
    path_params={**RUN_PATH, "index": {"type": "string", "pattern": "^[0-9]{1,9}$"}},
    body={"result": {"type": "object"}},
    required=("result",),
    responses={200: "OK", 409: "refused"},
    tags=("runs",),
    returns=RUN_WITH_STEPS,
)
def resolve_step(request: HttpRequest, run_id: str, index: str, body: dict) -> dict:
    run = run_or_404(run_id)
    step = selectors.run_step(run, int(index))
    if step is None:
        raise BadRequest(f"the run has no step #{index}", 404)
    services.resolve_step(step.id, body["result"], user=request.user)
    run.refresh_from_db()
    return run_payload(run, selectors.run_steps(run))
