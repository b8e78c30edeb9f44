"""The API's one request-parsing path: what a hostile body cannot get past.

A body is read only up to `API_MAX_BODY_BYTES` (413), only as JSON (415), and only as JSON that
every column and every consumer can hold (400 naming the field; the rules are
`agentruns.runtime.values.text`'s): no NaN or Infinity, no number too large for a 64-bit column or too long to
parse cheaply, no nesting deeper than `MAX_DEPTH`, no NUL byte and no lone surrogate in any
string or key.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse

from agentruns.conf import conf
from agentruns.runtime.values import text
from agentruns.runtime.values.text import INT_LIMIT, MAX_DEPTH, MAX_NUMBER_CHARS, UnsafeValue

__all__ = [
    "INT_LIMIT",
    "MAX_DEPTH",
    "MAX_NUMBER_CHARS",
    "BadRequest",
    "json_error",
    "json_response",
    "loads",
]


class BadRequest(Exception):
    """A refusal with its status and any extra fields for the JSON error body."""

    def __init__(self, message: str, status: int = 400, /, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def json_response(payload: Any, status: int = 200) -> HttpResponse:
    """JSON as UTF-8 (not \\u escapes), encodable whatever is stored (`text.printable`)."""
    body = json.dumps(payload, cls=DjangoJSONEncoder, ensure_ascii=False)
    return HttpResponse(text.printable(body), status=status, content_type="application/json")


def json_error(message: str, status: int, /, **extra: Any) -> HttpResponse:
    return json_response({"error": message, **extra}, status)


def check_text(value: str, where: str) -> None:
    try:
        text.check_text(value, where)
    except UnsafeValue as exc:
        raise BadRequest(str(exc)) from None


def loads(raw: bytes | str, where: str = "body") -> Any:
    """Strict JSON (see the module docstring); BadRequest for anything else."""
    try:
        return text.loads_strict(raw, where)
    except UnsafeValue as exc:
        raise BadRequest(str(exc)) from None


def parse_json_body(request: HttpRequest) -> dict:
    """The request's JSON object (an empty body is `{}`)."""
    length = request.headers.get("Content-Length") or "0"
    limit = conf.API_MAX_BODY_BYTES
    if not length.isascii() or not length.isdigit() or int(length) > limit:
        raise BadRequest(f"the body is larger than {limit} bytes", 413)
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BadRequest(f"the body is larger than {limit} bytes", 413) from None
    if len(raw) > limit:
        raise BadRequest(f"the body is larger than {limit} bytes", 413)
    if not raw.strip():
        return {}
    content_type = (request.content_type or "").lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise BadRequest("send the body as Content-Type: application/json", 415)
    data = loads(raw)
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data
