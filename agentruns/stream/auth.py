"""Socket auth: the session cookie (AuthMiddlewareStack) or the API's bearer token."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

from agentruns.stream.unavailable import CloseWhenUnavailable
from agentruns.tokens import bearer_from_header, user_for_token


class BearerTokenMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = {
            k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers", [])
        }
        raw = bearer_from_header(headers.get("authorization"))
        if raw:
            user = await database_sync_to_async(user_for_token)(raw)
            if user is not None:
                # the consumer re-checks the token while the socket is open (revoked: closed)
                scope = {**scope, "user": user, "auth_token": raw}
            else:
                scope = {**scope, "auth_error": "invalid token"}
        return await super().__call__(scope, receive, send)


def SessionOrTokenAuthMiddleware(inner):  # noqa: N802 - mirrors AuthMiddlewareStack
    # outermost: the session and token lookups need the database; without it, 4503
    return CloseWhenUnavailable(AuthMiddlewareStack(BearerTokenMiddleware(inner)))
