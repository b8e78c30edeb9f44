"""Sockets while the database (or Redis) is down: close with 4503, "try again later".

RFC 6455's own code for it, 1013, cannot leave daphne: its WebSocket library (autobahn) lets a
server close only with 1000 or a code from 3000-4999. So the stream uses 4503 (the private
range, as 4401/4403/4404 are, with the HTTP status it means); the run page's client
(agentruns/static/agentruns/runstream.js) treats only 4400-4499 as refusals, so on 4503 (as on any drop) it
reconnects with backoff and resumes from its cursor. A handshake must be accepted before a close
code reaches a browser, so a connection that fails before its consumer accepted (the session
lookup of the auth middleware) is accepted and closed at once.
"""

from __future__ import annotations

import logging
from typing import Any

from agentruns.runtime.outages.faults import is_infrastructure_error

log = logging.getLogger(__name__)

TRY_AGAIN_LATER = 4503
REASON = "database unavailable; reconnect later"


class CloseWhenUnavailable:
    """ASGI middleware around the socket stack: an outage raised anywhere inside (auth,
    consumer.connect) closes the socket with 4503 instead of failing the handshake."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope.get("type") != "websocket":
            return await self.inner(scope, receive, send)
        state = {"accepted": False, "closed": False}

        async def tracked_send(message: dict) -> None:
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            elif message["type"] == "websocket.close":
                state["closed"] = True
            await send(message)

        try:
            return await self.inner(scope, receive, tracked_send)
        except Exception as exc:
            if not is_infrastructure_error(exc) or state["closed"]:
                raise
            log.info("socket %s: closing 4503 (%s)", scope.get("path"), type(exc).__name__)
            if not state["accepted"]:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": REASON})
