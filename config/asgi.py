"""HTTP and WebSocket on one port: `daphne config.asgi:application` (or uvicorn)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application() does first

from agentruns.stream.http_handler import StreamingASGIHandler  # noqa: E402

# Django's handler, but an open SSE stream holds no thread of its own while it waits
django_asgi_app = StreamingASGIHandler()

from agentruns.web.outage import use_web_pool_wait  # noqa: E402

use_web_pool_wait()  # before the first connection makes the pool

from agentruns.web.static import StaticFiles  # noqa: E402

# daphne does not serve /static/ (runserver would): the run page's stream client and htmx live
# there, so the app serves its few static files itself, straight from the finders (a hostile
# path is a 404, not a 500)
django_asgi_app = StaticFiles(django_asgi_app)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agentruns.routing import websocket_urlpatterns  # noqa: E402
from agentruns.stream.auth import SessionOrTokenAuthMiddleware  # noqa: E402
from agentruns.stream.origin import ExactOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # the Origin must be this app's own address exactly (scheme, host, port)
        "websocket": ExactOriginValidator(
            SessionOrTokenAuthMiddleware(URLRouter(websocket_urlpatterns))
        ),
    }
)
