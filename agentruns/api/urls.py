"""The API's routes, built from the endpoint declarations; anything else under /api/ is a JSON 404."""

from __future__ import annotations

from collections import defaultdict

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path, re_path
from django.utils.module_loading import autodiscover_modules

from agentruns.api import chat, hooks, operations, run_list, runs  # noqa: F401
from agentruns.api.conversations import threads  # noqa: F401
from agentruns.api.endpoint import ENDPOINTS, authenticate, method_router
from agentruns.api.openapi import openapi_document
from agentruns.api.parsing import json_error


def openapi_json(request: HttpRequest) -> HttpResponse:
    refused = authenticate(request, session_writes=False)  # the API's own login: token or session
    return refused or JsonResponse(openapi_document())


def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    return json_error(f"no API route {request.path}", 404)


# it changes nothing, so any method may reach it: the CSRF check would answer a POST first
not_found.csrf_exempt = True  # type: ignore[attr-defined]


def _patterns() -> list:
    # every installed app's `api` module declares its endpoints (as `admin` modules do theirs)
    autodiscover_modules("api")
    by_route: dict[str, dict] = defaultdict(dict)
    for point in ENDPOINTS:
        by_route[point.route()][point.method] = point.view
    # routes with fewer parameters first, so `approvals/bulk` is not taken for an approval id
    # whichever module declared its endpoint first (the sort keeps declaration order otherwise)
    routes = sorted(by_route.items(), key=lambda item: item[0].count("<"))
    return [path(route, method_router(views)) for route, views in routes]


urlpatterns = [
    path("openapi.json", method_router({"GET": openapi_json}), name="api-openapi"),
    *_patterns(),
    re_path(r"^(?P<rest>.*)$", not_found),
]
