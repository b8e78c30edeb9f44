"""The API's routes, built from the endpoint declarations; any other path under the API's own
sections (`/api/runs/...`, `/api/approvals/...`, ...) is a JSON 404. Other /api/ paths are left to
the project's URLconf: a host project may serve an API of its own there (the demo's
config/urls.py answers them with `not_found` too)."""

from __future__ import annotations

import re
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
    patterns = [path(route, method_router(views)) for route, views in routes]
    # the sections the endpoints declare (`runs`, `approvals`, ...): anything else under them is ours
    sections = sorted({route.split("/")[0] for route in by_route})
    alternatives = "|".join(re.escape(section) for section in sections)
    patterns.append(re_path(rf"^(?P<rest>(?:{alternatives})(?:/.*)?)$", not_found))
    return patterns


urlpatterns = [
    path("openapi.json", method_router({"GET": openapi_json}), name="api-openapi"),
    *_patterns(),
]
