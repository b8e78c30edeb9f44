"""One typed-endpoint decorator for the whole JSON API (DESIGN.md 6).

    @endpoint("POST", "/runs/{run_id}/cancel", summary="Cancel a run", permission="agentruns.operate_run",
              path={"run_id": RUN_ID}, body={"reason": {"type": "string", "maxLength": 500}})
    def cancel_run(request, run_id, body):
        return run_payload(services.cancel_run(run_id, user=request.user, reason=body.get("reason", "")))

The decorator authenticates (bearer token; a session for reads, or for writes with a CSRF token),
checks the permission, parses the body through `api/parsing.py` (size, content type, hostile
JSON), validates path, query and body against their JSON schemas (strict types), and turns every
refusal into `{"error": ...}` with a 4xx status. The same declarations build the routes
(`api/urls.py`) and the OpenAPI description (`api/openapi.py`), so the three cannot drift.

A view returns a dict (200), `(dict, status)`, or an HttpResponse (streams).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.csrf import CsrfViewMiddleware

from agentruns.api.parsing import BadRequest, json_error, json_response, parse_json_body
from agentruns.registry import strict_validator
from agentruns.registry.schemas import type_words
from agentruns.runtime.access.quotas import QuotaExceeded
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.stream.access.slots import SLOTS, Slot
from agentruns.stream.access.sse import held_stream
from agentruns.tokens import bearer_from_header, user_for_token

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

# reusable parameter schemas
RUN_ID = {
    "type": "string",
    "format": "uuid",
    "pattern": "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$",
}
INT_ID = {"type": "string", "pattern": "^[0-9]{1,18}$"}


@dataclass
class Endpoint:
    """One JSON endpoint as `@endpoint` declares it (its keywords are these fields)."""

    method: str
    path: str  # OpenAPI style, under /api: "/runs/{run_id}"
    view: Callable[..., Any]
    summary: str
    permission: str | None = None
    path_params: dict[str, dict] = field(default_factory=dict)  # a schema per parameter
    query: dict[str, dict] = field(default_factory=dict)  # a schema per parameter
    body: dict | None = None  # the body's JSON schema (an object), None: no body
    responses: dict[int, str] = field(default_factory=lambda: {200: "OK"})
    session_writes: bool = False  # session callers may write (with the CSRF token)
    returns: dict | None = None  # the JSON schema of a 2xx answer's body
    headers: dict[str, dict] = field(default_factory=dict)  # request headers it reads
    example: dict | None = None  # a body that works (the description's example)
    # path parameters its 2xx answer provides, as JSON pointers into the body: {"run_id": "/id"}
    # (the description links them to the operations that take that parameter)
    provides: dict[str, str] = field(default_factory=dict)
    # its 200 answer is a text/event-stream (the AI SDK's UI messages): it takes a stream slot
    # before the view runs (429 with Retry-After when none is free, stream/access/slots.py)
    streams: bool = False
    description: str = ""  # the view's docstring
    tags: tuple[str, ...] = ()
    # a machine sender's own proof, tried before the user's (`api/hooks`: a Standard Webhooks
    # signature): True: accepted without a user or a permission; a response: refused; False:
    # not one, the usual authentication follows
    machine: Callable[[HttpRequest], HttpResponseBase | bool] | None = None

    def route(self) -> str:
        """The Django route: every parameter as <str:...>, so a malformed one reaches our JSON
        error instead of Django's HTML 404."""
        return re.sub(r"\{(\w+)\}", r"<str:\1>", self.path.lstrip("/"))


ENDPOINTS: list[Endpoint] = []


class _Validated:
    """Compiled validators of one endpoint's parameters."""

    def __init__(self, path: dict[str, dict], query: dict[str, dict], body: dict | None) -> None:
        self.path = {name: strict_validator(schema) for name, schema in path.items()}
        self.query = {name: strict_validator(schema) for name, schema in query.items()}
        self.body = strict_validator(body) if body is not None else None


def _check(validator: Any, value: Any, where: str, *, not_found: bool = False) -> None:
    """Raise BadRequest naming the field (`'input.order_id' must be a string`) for the first
    problem the schema finds; a malformed id is a 404, the same answer as an unknown one."""
    error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.path))), None)
    if error is None:
        return
    if not_found:
        raise BadRequest(f"no such {where.removesuffix('_id')}", 404)
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required":
        # the first required name the instance lacks (from the schema, not the message's text)
        missing = [k for k in error.validator_value if k not in error.instance]
        path.append(missing[0] if missing else "?")
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        path.append(extra[0] if extra else "?")
    # a body field is quoted as its JSON key; a query parameter by its name
    name = f"'{'.'.join(path)}'" if where == "body" and path else ".".join([where, *path])
    if error.validator == "required":
        raise BadRequest(f"{name} is required")
    if error.validator == "additionalProperties":
        raise BadRequest(f"{name} is not a known field")
    if error.validator == "enum":
        raise BadRequest(f"{name} must be one of {', '.join(map(str, error.validator_value))}")
    if error.validator == "type":
        raise BadRequest(f"{name} must be {type_words(error.validator_value)}")
    raise BadRequest(f"{name}: {error.message}")


def _coerce_query(raw: str, schema: dict) -> Any:
    kind = schema.get("type")
    if kind == "integer":
        if not re.fullmatch(r"-?[0-9]{1,18}", raw):
            return raw  # the schema check names the problem
        return int(raw)
    if kind == "boolean":
        return {"true": True, "1": True, "false": False, "0": False}.get(raw.lower(), raw)
    return raw


def authenticate(request: HttpRequest, *, session_writes: bool) -> HttpResponse | None:
    """Bearer token, or the session (reads; writes only with a valid CSRF token, where the
    endpoint allows browser writes). Sets request.user; returns a refusal or None."""
    raw = bearer_from_header(request.headers.get("Authorization"))
    if raw:
        user = user_for_token(raw)
        if user is None:
            return json_error("invalid, revoked or expired token", 401)
        request.user = user
        return None
    if request.headers.get("Authorization"):
        return json_error("authentication required: send 'Authorization: Bearer <token>'", 401)
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return json_error("authentication required: send 'Authorization: Bearer <token>'", 401)
    if request.method in SAFE_METHODS:
        return None
    if not session_writes:
        return json_error("authentication required: send 'Authorization: Bearer <token>'", 401)
    refused = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, None, (), {})
    if refused is not None:
        return json_error(
            "CSRF token missing or incorrect (send X-CSRFToken with the session)", 403
        )
    return None


def endpoint(
    method: str,
    path: str,
    *,
    summary: str,
    body: dict[str, dict] | dict | None = None,
    required: tuple[str, ...] = (),
    **declared: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a JSON endpoint. `body`: the properties of the JSON object the body must be (or a
    whole schema with "type"), `required` its required names; every other keyword is a field
    of `Endpoint` (an unknown one is a TypeError at import): `path_params` and `query` a schema
    per parameter, `returns` the schema of its 2xx answers (`api/schemas.py`), `headers` request
    headers it reads (documented; the view checks them), `example` a body that works,
    `provides` path parameters its answer holds (`{"run_id": "/id"}`)."""
    if body is not None and body.get("type") != "object":
        body = {
            "type": "object",
            "properties": body,
            "required": list(required),
            "additionalProperties": False,
        }

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        point = Endpoint(
            method,
            path,
            view,
            summary,
            body=body,
            description=(view.__doc__ or "").strip(),
            **declared,
        )
        permission, query, session_writes = point.permission, point.query, point.session_writes
        streams, machine = point.streams, point.machine
        checks = _Validated(point.path_params, query, body)

        @wraps(view)
        def handle(request: HttpRequest, **kwargs: str) -> HttpResponseBase:
            signed = machine(request) if machine is not None else False
            if isinstance(signed, HttpResponseBase):
                return signed
            refused = None if signed else authenticate(request, session_writes=session_writes)
            if refused is not None:
                return refused
            if not signed and permission and not request.user.has_perm(permission):
                return json_error(f"permission denied: {permission} is required", 403)
            slot: Slot | None = None
            try:
                args: dict[str, Any] = {}
                for name, validator in checks.path.items():
                    _check(validator, kwargs[name], name, not_found=True)
                    args[name] = kwargs[name]
                for name, validator in checks.query.items():
                    if name in request.GET:
                        value = _coerce_query(request.GET[name], query[name])
                        _check(validator, value, name)
                        args[name] = value
                if checks.body is not None:
                    data = parse_json_body(request)
                    _check(checks.body, data, "body")
                    args["body"] = data
                if streams:  # before the view: a refused stream starts and decides nothing
                    slot = SLOTS.take(request.user.pk)
                result = view(request, **args)
            except BadRequest as exc:
                result = json_error(str(exc), exc.status, **exc.extra)
            except ActionRefused as exc:
                result = json_error(str(exc), 409)
            except PermissionDenied as exc:  # a service's own check (start_run for a fork, ...)
                result = json_error(str(exc) or "permission denied", 403)
            except ObjectDoesNotExist:
                result = json_error("not found", 404)
            except QuotaExceeded as exc:  # a start quota, or no free stream slot
                result = quota_refusal(exc)
            except BaseException:
                if slot is not None:
                    slot.release()
                raise
            if isinstance(result, HttpResponseBase):
                # a stream holds its slot and ends with its viewer's right; anything else gives
                # the slot back
                return held_stream(result, request, slot)
            payload, status = result if isinstance(result, tuple) else (result, 200)
            return json_response(payload, status)

        handle.csrf_exempt = True  # type: ignore[attr-defined]  # bearer: not ambient; sessions: checked above
        point.view = handle
        ENDPOINTS.append(point)
        return handle

    return decorate


def quota_refusal(exc: QuotaExceeded) -> HttpResponse:
    """429 with Retry-After, `{"error": ...}` (the pages' middleware answers the same in text)."""
    response = json_error(str(exc), 429, retry_after=exc.retry_after)
    response["Retry-After"] = str(exc.retry_after)
    return response


def method_router(views: dict[str, Callable[..., HttpResponse]]) -> Callable[..., HttpResponse]:
    """One URL, its endpoints by method; any other method is a JSON 405 with `Allow`."""

    def route(request: HttpRequest, **kwargs: str) -> HttpResponse:
        view = views.get(request.method or "")
        if view is None and request.method == "HEAD":
            view = views.get("GET")
        if view is None:
            response = json_error(f"method {request.method} not allowed", 405)
            response["Allow"] = ", ".join(sorted(views))
            return response
        return view(request, **kwargs)

    route.csrf_exempt = True  # type: ignore[attr-defined]
    return route
