"""Django's own error answers, as JSON under /api/ (DESIGN 6: every API error is `{"error": ...}`).

The API's views answer their own errors; these cover what happens before a view or outside one:
the CSRF check (`CSRF_FAILURE_VIEW`), a bad Host header or a suspicious request (400), the
URLconf's 500 handler, and the 403/404 of `/api/` paths (the URLconf's 403/404 handlers are the
layout's pages, `agentruns/web/layout/errors.py`, which hand `/api/` paths here).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views import csrf, defaults

from agentruns.api.parsing import json_error

API_PREFIX = "/api/"


def under_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    if under_api(request):
        return json_error(
            "CSRF token missing or incorrect (send X-CSRFToken with the session, or use "
            "'Authorization: Bearer <token>')",
            403,
        )
    return csrf.csrf_failure(request, reason=reason)


def bad_request(request: HttpRequest, exception: Exception, **kwargs: Any) -> HttpResponse:
    if under_api(request):
        return json_error("bad request", 400)
    return defaults.bad_request(request, exception, **kwargs)


def permission_denied(
    request: HttpRequest, exception: Exception | None, **kwargs: Any
) -> HttpResponse:
    if under_api(request):
        return json_error(str(exception or "") or "permission denied", 403)
    return defaults.permission_denied(request, exception, **kwargs)


def page_not_found(request: HttpRequest, exception: Exception, **kwargs: Any) -> HttpResponse:
    if under_api(request):
        return json_error(f"no API route {request.path}", 404)
    return defaults.page_not_found(request, exception, **kwargs)


def server_error(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    if under_api(request):
        return json_error("internal error", 500)
    return defaults.server_error(request, **kwargs)
