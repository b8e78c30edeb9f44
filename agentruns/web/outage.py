"""The web while a dependency is down: "back soon", never a 500 (DESIGN.md 4.10).

While the database (or Redis) is unreachable, every request that needs it answers 503 with
`Retry-After`: `{"error": ...}` under `/api/`, a plain page without the base layout elsewhere
(the layout reads the user and the navigation counts, i.e. the database), never a traceback or
Django's debug page. `runtime/outages/faults.py` decides what counts as an outage.

Where the error is raised decides how it is caught. A view (or the template it renders: the
navigation's context processor) raises into `process_exception`, which answers at once. The
session and the user are loaded lazily, so they too fail inside the view; what still fails in
another middleware (a session saved on the way out) has already been turned into a 500 by
Django's per-middleware exception handling before it reaches us: `got_request_exception` marks
the request and this outermost middleware swaps that 500 (or debug page) for the 503.

A request never waits long for the database: the web's pool wait is `WEB_DB_POOL_TIMEOUT`
seconds (`use_web_pool_wait`, from agentruns/asgi.py), not the worker's half-minute.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.signals import got_request_exception
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from agentruns.api.parsing import json_error
from agentruns.conf import conf
from agentruns.runtime.outages.faults import database_unavailable, redis_unavailable

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
LOG_EVERY_SECONDS = 30.0  # one warning per outage-ish, not one per request
_OUTAGE_ATTR = "_agentruns_outage"
_last_logged = 0.0


def unavailable_dependency(exc: BaseException) -> str | None:
    """ "database" or "redis" when `exc` says that dependency is down, else None."""
    if database_unavailable(exc):
        return "database"
    if redis_unavailable(exc):
        return "redis"
    return None


def outage_response(request: HttpRequest, dependency: str) -> HttpResponse:
    message = f"the {dependency} is unavailable; try again in {RETRY_AFTER_SECONDS} seconds"
    if request.path.startswith("/api/"):
        response = json_error(message, 503, unavailable=dependency)
    else:
        # no request in the context: no context processor (user, navigation) may touch the
        # database while rendering it
        page = render_to_string(
            "agentruns/outage.html", {"dependency": dependency, "retry_after": RETRY_AFTER_SECONDS}
        )
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response


def _note(request: HttpRequest, dependency: str, exc: BaseException) -> None:
    global _last_logged
    setattr(request, _OUTAGE_ATTR, dependency)
    now = time.monotonic()
    if now - _last_logged >= LOG_EVERY_SECONDS:
        _last_logged = now
        log.warning("%s unavailable: answering 503 (%s: %s)", dependency, type(exc).__name__, exc)


class AnswerOutagesWithRetryLater:
    """First in MIDDLEWARE (see the module docstring). Sync and async: being outermost, a
    sync-only middleware would push every request, the async streams too, onto a thread."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.async_mode:
            return self._acall(request)
        return self._answer(request, self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._answer(request, await self.get_response(request))

    @staticmethod
    def _answer(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        dependency = getattr(request, _OUTAGE_ATTR, None)
        if dependency is not None and response.status_code >= 500:
            return outage_response(request, dependency)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        dependency = unavailable_dependency(exc)
        if dependency is None:
            return None
        _note(request, dependency, exc)
        return outage_response(request, dependency)


def _mark_outage(sender: object, request: HttpRequest | None = None, **kwargs: object) -> None:
    """An exception outside a view (another middleware) is about to become a 500: remember
    that it was an outage, so the outermost middleware answers 503 instead."""
    exc = sys.exc_info()[1]
    if request is None or exc is None:
        return
    dependency = unavailable_dependency(exc)
    if dependency is not None:
        _note(request, dependency, exc)


got_request_exception.connect(_mark_outage, dispatch_uid="agentruns-outage-503")


def use_web_pool_wait() -> None:
    """The web process waits at most WEB_DB_POOL_TIMEOUT for a pooled connection (the pool is
    made on first use, from these options): a request during an outage answers 503 in seconds
    instead of holding the client for the worker's DB_POOL_TIMEOUT."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if isinstance(pool, dict):
        pool["timeout"] = conf.WEB_DB_POOL_TIMEOUT
