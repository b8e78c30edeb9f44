"""The error pages people see: 403, 404 (and the 429 and 503 pages of their middlewares) in the
base layout; under /api/ the API's JSON answers (`agentruns/api/errors.py`, DESIGN.md 6).

Installed as Django's `handler403` / `handler404` (config/urls.py), so a view's
`PermissionDenied` (a viewer opening /runs/new/, a service refusing a start) and `Http404` are
answered here instead of Django's bare text.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from agentruns.api import errors as api_errors


def _message(exception: Exception | None) -> str:
    text = str(exception or "").strip()
    # Django's own exceptions carry no message, or its internal resolver dict (404)
    return "" if not text or text.startswith("{") else text


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if api_errors.under_api(request):
        return api_errors.permission_denied(request, exception)
    context = {"message": _message(exception)}
    return render(request, "agentruns/errors/403.html", context, status=403)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if api_errors.under_api(request):
        return api_errors.page_not_found(request, exception)
    return render(request, "agentruns/errors/404.html", {"path": request.path}, status=404)
