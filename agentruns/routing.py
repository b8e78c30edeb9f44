from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import re_path

from agentruns.stream.consumer import RunStreamConsumer


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other socket path: accepted and closed with 4404, like an unknown run (without this,
    the router raises and the handshake is a 500 with a traceback in the log)."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=4404, reason="no such socket path")


websocket_urlpatterns = [
    re_path(r"^ws/runs/(?P<run_id>[0-9a-fA-F-]{32,36})/$", RunStreamConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),  # last: whatever matched nothing above
]
