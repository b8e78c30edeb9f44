"""HTTP, WebSocket and SSE on one port, for the project named by DJANGO_SETTINGS_MODULE:

    DJANGO_SETTINGS_MODULE=shop.settings daphne agentruns.asgi:application

Django's ASGI handler, except that an open SSE stream holds no thread while it waits, with the
apps' static files served (daphne serves none itself) and the run streams' WebSocket routes
behind the session-or-token login and an exact Origin check. A project with WebSocket routes of
its own serves them beside the run streams:

    application = ProtocolTypeRouter(
        {"http": http_application, "websocket": websocket_application(my_routes)}
    )
"""

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if not os.environ.get("DJANGO_SETTINGS_MODULE") and not settings.configured:
    raise ImproperlyConfigured(
        "agentruns.asgi serves the project named by DJANGO_SETTINGS_MODULE: set it, e.g. "
        "DJANGO_SETTINGS_MODULE=shop.settings daphne agentruns.asgi:application"
    )

import django  # noqa: E402

django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application() does first

from agentruns.installation.checks import errors  # noqa: E402

# daphne runs no system checks: a project whose settings stop the apps is refused here, by name
if problems := errors():
    raise ImproperlyConfigured(
        "the project's settings are not ready for the apps (`manage.py check` says the same):\n"
        + "\n".join(f"{p.id}: {p.msg} ({p.hint})" for p in problems)
    )

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from agentruns.stream.auth import SessionOrTokenAuthMiddleware  # noqa: E402
from agentruns.stream.consumer import RunStreamConsumer  # noqa: E402
from agentruns.stream.http_handler import StreamingASGIHandler  # noqa: E402
from agentruns.stream.origin import ExactOriginValidator  # noqa: E402
from agentruns.web.outage import use_web_pool_wait  # noqa: E402
from agentruns.web.static import StaticFiles  # noqa: E402

use_web_pool_wait()  # before the first connection makes the pool

# Django's handler, but an open SSE stream holds no thread of its own while it waits; /static/
# served straight from the finders (the run page's stream client and htmx live there; a hostile
# path is a 404, not a 500)
http_application = StaticFiles(StreamingASGIHandler())


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other socket path: accepted and closed with 4404, like an unknown run (without this,
    the router raises and the handshake is a 500 with a traceback in the log)."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=4404, reason="no such socket path")


RUN_SOCKETS = [re_path(r"^ws/runs/(?P<run_id>[0-9a-fA-F-]{32,36})/$", RunStreamConsumer.as_asgi())]


def websocket_application(extra_routes: list | None = None):
    """The run streams, then a project's own routes, then a 4404 for whatever matched none,
    behind the login and the exact Origin (the scheme, host and port of this app's own
    address)."""
    routes = [*RUN_SOCKETS, *(extra_routes or []), re_path(r"", NoSuchSocket.as_asgi())]
    return ExactOriginValidator(SessionOrTokenAuthMiddleware(URLRouter(routes)))


application = ProtocolTypeRouter({"http": http_application, "websocket": websocket_application()})
