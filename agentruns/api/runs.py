"""JSON API for runs and events (DESIGN.md 6). Views stay thin: services write, selectors read."""

from __future__ import annotations

import uuid

from django.http import HttpRequest, JsonResponse

from agentruns import selectors, services
from agentruns.api.http import BadRequest, api_view, json_body, json_error
from agentruns.api.serializers import run_payload
from agentruns.registry import UnknownAgent
from agentruns.runtime.events import event_payload


def _run_or_404(run_id: str):
    try:
        uuid.UUID(str(run_id))
    except ValueError:
        raise BadRequest("no such run", 404) from None
    run = selectors.get_run(run_id)
    if run is None:
        raise BadRequest("no such run", 404)
    return run


def _require_view(request: HttpRequest) -> None:
    if not request.user.has_perm("agentruns.view_run"):
        raise BadRequest("permission denied: agentruns.view_run is required", 403)


@api_view(("POST",))
def create_run(request: HttpRequest) -> JsonResponse:
    body = json_body(request)
    agent = body.get("agent")
    run_input = body.get("input", {})
    if not isinstance(agent, str) or not agent:
        raise BadRequest("'agent' is required")
    if not isinstance(run_input, dict):
        raise BadRequest("'input' must be a JSON object")
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and len(key) > 200:
        raise BadRequest("Idempotency-Key is longer than 200 characters")
    try:
        result = services.start_run(agent, run_input, dedupe_key=key, user=request.user)
    except UnknownAgent as exc:
        raise BadRequest(str(exc)) from None
    except ValueError as exc:
        raise BadRequest(f"invalid input: {exc}") from None
    return JsonResponse(run_payload(result.run, []), status=201 if result.created else 200)


@api_view(("GET",))
def run_detail(request: HttpRequest, run_id: str) -> JsonResponse:
    _require_view(request)
    run = _run_or_404(run_id)
    return JsonResponse(run_payload(run, selectors.run_steps(run)))


@api_view(("GET",))
def run_events(request: HttpRequest, run_id: str) -> JsonResponse:
    _require_view(request)  # the same rule as the socket
    run = _run_or_404(run_id)
    try:
        after = int(request.GET.get("after", "0"))
        limit = min(max(int(request.GET.get("limit", "1000")), 1), 5000)
    except ValueError:
        raise BadRequest("'after' and 'limit' must be integers") from None
    events = selectors.events_after(run.id, after, limit)
    return JsonResponse({"events": [event_payload(e) for e in events], "last_seq": run.last_seq})


def _operate(request: HttpRequest, run_id: str, action, **kwargs) -> JsonResponse:
    """The same service functions, permission and refusals as the run page's buttons."""
    if not request.user.has_perm("agentruns.operate_run"):
        return json_error("permission denied: agentruns.operate_run is required", 403)
    run = _run_or_404(run_id)
    try:
        run = action(run.id, user=request.user, **kwargs)
    except services.ActionRefused as exc:
        return json_error(str(exc), 409)
    run.refresh_from_db()
    return JsonResponse(run_payload(run))


@api_view(("POST",))
def cancel_run(request: HttpRequest, run_id: str) -> JsonResponse:
    reason = json_body(request).get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        raise BadRequest("'reason' must be a string of at most 500 characters")
    return _operate(request, run_id, services.cancel_run, reason=reason)


@api_view(("POST",))
def retry_run(request: HttpRequest, run_id: str) -> JsonResponse:
    return _operate(request, run_id, services.retry_run)


@api_view(("POST",))
def fork_run(request: HttpRequest, run_id: str) -> JsonResponse:
    """`{"from_step": N}` (a model step) -> 201 with the new run, which continues from there."""
    if not request.user.has_perm("agentruns.operate_run"):
        return json_error("permission denied: agentruns.operate_run is required", 403)
    run = _run_or_404(run_id)
    from_step = json_body(request).get("from_step")
    if not isinstance(from_step, int) or isinstance(from_step, bool) or from_step < 0:
        raise BadRequest("'from_step' must be the index of a model step (an integer)")
    try:
        fork = services.fork_run(run.id, from_step, user=request.user)
    except services.ActionRefused as exc:
        return json_error(str(exc), 409)
    return JsonResponse(run_payload(fork, selectors.run_steps(fork)), status=201)


@api_view(("POST",))
def resolve_step(request: HttpRequest, run_id: str, index: int) -> JsonResponse:
    """`{"result": {...}}`: a failed side-effect step is done by hand; the failed run continues."""
    if not request.user.has_perm("agentruns.operate_run"):
        return json_error("permission denied: agentruns.operate_run is required", 403)
    run = _run_or_404(run_id)
    result = json_body(request).get("result")
    if not isinstance(result, dict):
        raise BadRequest("'result' must be a JSON object (what the tool would have returned)")
    step = selectors.run_step(run, index)
    if step is None:
        raise BadRequest(f"the run has no step #{index}", 404)
    try:
        services.resolve_step(step.id, result, user=request.user)
    except services.ActionRefused as exc:
        return json_error(str(exc), 409)
    run.refresh_from_db()
    return JsonResponse(run_payload(run, selectors.run_steps(run)))
