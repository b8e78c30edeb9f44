"""The OpenAPI 3.1 description of the JSON API, built from the endpoint declarations
(`api/endpoint.py`), served at /api/openapi.json."""

from __future__ import annotations

from typing import Any

from agentruns.api.endpoint import ENDPOINTS, Endpoint

ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
STANDARD_ERRORS = {
    400: "bad request (the message names the field)",
    401: "no or bad credentials",
    403: "permission denied",
    404: "not found",
    413: "body too large",
    415: "body is not JSON",
    429: "over a quota (runs started, runs in flight, decisions, open streams): see Retry-After",
}


# one event of a UI message stream, as a client parses it: its `data` is one chunk as JSON (the
# AI SDK's `uiMessageChunkSchema`), the last one `[DONE]`
SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}},
    "required": ["data"],
}


def _responses(point: Endpoint) -> dict[str, Any]:
    out: dict[str, Any] = {}
    errors = dict(STANDARD_ERRORS)
    if point.body is None:
        errors.pop(413), errors.pop(415)  # no body is read
    if point.method == "GET" and not point.streams:
        errors.pop(429)  # reads are not metered; streams count against the stream caps
    if not point.path_params:
        errors.pop(404)
    for status, text in sorted({**errors, **point.responses}.items()):
        if status == 204:  # no content
            out[str(status)] = {"description": text}
            continue
        schema = (point.returns or {"type": "object"}) if status < 400 else ERROR
        out[str(status)] = {
            "description": text,
            "content": {"application/json": {"schema": schema}},
        }
    links = _links(point)
    for status in out:
        if links and status.startswith("2"):
            out[status]["links"] = links
    if point.streams:
        out["200"]["content"] = {"text/event-stream": {"schema": SSE_EVENT}}
    return out


def _links(point: Endpoint) -> dict[str, Any]:
    """From an answer that provides a path parameter to every operation that takes it."""
    links = {}
    for name, pointer in point.provides.items():
        for other in ENDPOINTS:
            if other is not point and name in other.path_params:
                links[other.view.__name__] = {
                    "operationId": other.view.__name__,
                    "parameters": {name: f"$response.body#{pointer}"},
                }
    return links


def _operation(point: Endpoint) -> dict[str, Any]:
    parameters = (
        [
            {"name": name, "in": "path", "required": True, "schema": schema}
            for name, schema in point.path_params.items()
        ]
        + [
            {"name": name, "in": "query", "required": False, "schema": schema}
            for name, schema in point.query.items()
        ]
        + [
            {"name": name, "in": "header", "required": False, "schema": schema}
            for name, schema in point.headers.items()
        ]
    )
    operation: dict[str, Any] = {
        "operationId": point.view.__name__,
        "summary": point.summary,
        "tags": list(point.tags),
        "parameters": parameters,
        "responses": _responses(point),
        "security": [{"bearer": []}, {"session": []}]
        if point.method == "GET" or point.session_writes
        else [{"bearer": []}],
    }
    if point.description:
        operation["description"] = point.description
    if point.permission:
        operation["description"] = (
            operation.get("description", "") + f"\n\nNeeds `{point.permission}`."
        ).strip()
    if point.body is not None:
        media: dict[str, Any] = {"schema": point.body}
        if point.example is not None:
            media["example"] = point.example
        operation["requestBody"] = {"required": False, "content": {"application/json": media}}
    return operation


def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for point in ENDPOINTS:
        paths.setdefault("/api" + point.path, {})[point.method.lower()] = _operation(point)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Agent runs",
            "version": "1",
            "description": "Durable agent runs with an approval inbox.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`manage.py create_api_token <user>`",
                },
                "session": {"type": "apiKey", "in": "cookie", "name": "sessionid"},
            }
        },
    }
