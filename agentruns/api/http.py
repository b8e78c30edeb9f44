"""Small helpers for JSON endpoints: bearer auth, JSON bodies, JSON errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, JsonResponse

from agentruns.tokens import bearer_from_header, user_for_token


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def json_error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def json_body(request: HttpRequest) -> dict:
    if not request.body:
        return {}
    try:
        data = json.loads(request.body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def api_view(methods: tuple[str, ...]) -> Callable:
    """Bearer-token (or session, for reads) auth, method check, and JSON errors for everything."""

    def decorate(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
            if request.method not in methods:
                return json_error(f"method {request.method} not allowed", 405)
            raw = bearer_from_header(request.headers.get("Authorization"))
            user = user_for_token(raw) if raw else None
            if (
                user is None
                and not raw
                and request.method == "GET"
                and request.user.is_authenticated
            ):
                user = request.user
            if user is None:
                return json_error(
                    "authentication required: send 'Authorization: Bearer <token>'", 401
                )
            request.user = user
            try:
                return view(request, *args, **kwargs)
            except BadRequest as exc:
                return json_error(str(exc), exc.status)

        wrapper.csrf_exempt = True  # bearer tokens are not ambient credentials
        return wrapper

    return decorate
