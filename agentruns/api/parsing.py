"""The API's one request-parsing path: what a hostile body cannot get past.

A body is read only up to `API_MAX_BODY_BYTES` (413), only as JSON (415), and only as JSON that
every column and every consumer can hold (400 naming the field): no NaN or Infinity, no number
too large for a 64-bit column or too long to parse cheaply, no nesting deeper than
`MAX_DEPTH`, no NUL byte and no lone surrogate in any string or key (PostgreSQL rejects both
in text and jsonb, and a lone surrogate cannot be encoded as UTF-8 on the way out).
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse

from agentruns.conf import conf

MAX_DEPTH = 32
INT_LIMIT = 2**63 - 1
MAX_NUMBER_CHARS = 40


class BadRequest(Exception):
    """A refusal with its status and any extra fields for the JSON error body."""

    def __init__(self, message: str, status: int = 400, /, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def json_error(message: str, status: int, /, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _reject_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON number")


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BadRequest(f"number {text[:20]}… is too long")
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"number {text[:20]} is out of range")
    return value


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise BadRequest(f"integer {text[:20]}… is too large")
    value = int(text)
    if abs(value) > INT_LIMIT:
        raise BadRequest(f"integer {text} is out of range (at most 2^63 - 1)")
    return value


def check_text(value: str, where: str) -> None:
    if "\x00" in value:
        raise BadRequest(f"{where}: NUL bytes are not allowed in text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{where}: lone surrogates are not allowed in text") from None


def check_value(value: Any, where: str = "body", depth: int = 0) -> None:
    """Every string and key printable to UTF-8 and storable; depth bounded."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, f"{where} (a key)")
            check_value(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_value(item, f"{where}[{i}]", depth + 1)


def loads(raw: bytes | str) -> Any:
    """Strict JSON (see the module docstring); BadRequest for anything else."""
    try:
        data = json.loads(
            raw, parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
        )
    except BadRequest:
        raise
    except RecursionError:
        raise BadRequest(f"body: nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    check_value(data)
    return data


def parse_json_body(request: HttpRequest) -> dict:
    """The request's JSON object (an empty body is `{}`)."""
    length = request.headers.get("Content-Length") or "0"
    limit = conf.API_MAX_BODY_BYTES
    if not length.isdigit() or int(length) > limit:
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
