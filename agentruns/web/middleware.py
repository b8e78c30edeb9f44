"""Refuse query strings and form posts that no column can hold, before any view reads them;
answer a quota refusal (`runtime/access/quotas.py`) as 429 with Retry-After wherever it is raised.

Django decodes form and query values with errors="replace", so they never hold a lone
surrogate, but `%00` decodes to a NUL byte, which PostgreSQL refuses in any text or jsonb
parameter: a search, a filter or a rejection reason with one would reach the database as a
DataError (a 500). This answers 400 instead (JSON under /api/), naming the field. JSON bodies
are checked by the API's own parser (`api/parsing.py`), which also refuses the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from agentruns.api.endpoint import quota_refusal
from agentruns.api.parsing import json_error
from agentruns.runtime.access.quotas import QuotaExceeded


class RefuseUnstorableInput:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            problem = self._problem(request)
        except RequestDataTooBig:
            if request.path.startswith("/api/"):
                return json_error("the body is too large", 413)
            raise  # Django's own 400 page
        if problem is not None:
            if request.path.startswith("/api/"):
                return json_error(problem, 400)
            return HttpResponseBadRequest(problem, content_type="text/plain; charset=utf-8")
        return self.get_response(request)

    @staticmethod
    def _problem(request: HttpRequest) -> str | None:
        sources = [("query parameter", request.GET)]
        if request.method == "POST" and request.content_type in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ):
            sources.append(("form field", request.POST))
        for kind, values in sources:
            for key, items in values.lists():
                if "\x00" in key or any("\x00" in item for item in items):
                    return f"{kind} {key.replace(chr(0), '?')!r}: NUL bytes are not allowed"
        return None


class AnswerQuotaRefusals:
    """A start or a decision over its quota, from any page (the API's endpoints answer their
    own): 429, Retry-After, and a page that says so (an HTMX swap gets the message alone)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not isinstance(exc, QuotaExceeded):
            return None
        if request.path.startswith("/api/"):
            return quota_refusal(exc)
        if request.headers.get("HX-Request"):
            response = HttpResponse(str(exc), status=429, content_type="text/plain; charset=utf-8")
        else:
            context = {"message": str(exc), "retry_after": exc.retry_after}
            response = render(request, "agentruns/quota_exceeded.html", context, status=429)
        response["Retry-After"] = str(exc.retry_after)
        return response
