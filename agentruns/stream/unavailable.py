"""Sockets while the database (or Redis) is down: close with 1013 "try again later".

RFC 6455's 1013 tells the client the server cannot serve it now; the run page's client
(static/js/runstream.js) reconnects with backoff on it (as on any close that is not a 44xx
refusal) and resumes from its cursor. A handshake must be accepted before a close code reaches a
browser, so a connection that fails before its consumer accepted (the session lookup of the auth
middleware) is accepted and closed at once.
"""

from __future__ import annotations

import logging
from typing import Any

from agentruns.runtime.faults import is_infrastructure_error

log = logging.getLogger(__name__)

TRY_AGAIN_LATER = 1013
REASON = "database unavailable; reconnect later"


class CloseWhenUnavailable:
    """ASGI middleware around the socket stack: an outage raised anywhere inside (auth,
    consumer.connect) closes the socket with 1013 instead of failing the handshake."""

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
            log.info("socket %s: closing 1013 (%s)", scope.get("path"), type(exc).__name__)
            if not state["accepted"]:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": REASON})
