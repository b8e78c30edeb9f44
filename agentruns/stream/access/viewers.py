"""Who watches a stream, and the one task per process that ends the streams whose viewer may no
longer watch.

A stream (a run socket, a chat SSE stream, its resume stream) stays open only while its viewer
- still holds what opened it: its bearer token (not revoked, not expired) or its session (not
  signed out, not expired, still the same user's, the password not changed since: Django's own
  rules for a session, `django.contrib.auth.get_user`), and is still active: else it ends as
  4401 ("credential gone": the run page does not reconnect with it);
- still has `agentruns.view_run` (their own, a group's, or as a superuser): else 4403.
A socket closes with that code; an SSE stream ends with an AI SDK `error` chunk naming it.

One task per process and event loop rechecks every open stream's viewer every RECHECK_SECONDS
(fixed-rate ticks), in one query per kind whatever the number of streams: the tokens, the
sessions, and the users with their right (400 streams of one token are one token and one user to
look up, not 400 queries). So a stream ends within 2 s of its viewer's deactivation, a lost group
or permission, a sign-out or a revoked token, even while the run is silent.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.sessions.models import Session
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from agentruns.models import ApiToken
from agentruns.tokens import bearer_from_header, hash_token

log = logging.getLogger(__name__)

VIEW_RUN = "agentruns.view_run"  # what watching any run needs (the run page's and the API's right)
RECHECK_SECONDS = 1.5  # a tick, its three queries and the close fit in 2 s
CREDENTIAL_GONE = 4401
RIGHT_GONE = 4403


@dataclass(frozen=True)
class Credential:
    kind: str  # "token" (value: its SHA-256) or "session" (value: the session key)
    value: str


@dataclass(frozen=True)
class Viewer:
    """What opened a stream, and whose it is."""

    credential: Credential
    user_id: str  # the user's pk as text (a session stores it so)


@dataclass(frozen=True)
class Ending:
    code: int  # CREDENTIAL_GONE or RIGHT_GONE
    reason: str


End = Callable[[Ending], None]


def viewer_of_scope(scope: dict) -> Viewer | None:
    """A socket's viewer (stream/auth.py puts a bearer token in `auth_token`)."""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return None
    if scope.get("auth_token"):
        return Viewer(Credential("token", hash_token(scope["auth_token"].strip())), str(user.pk))
    session = scope.get("session")
    key = getattr(session, "session_key", None) if session is not None else None
    return Viewer(Credential("session", key), str(user.pk)) if key else None


def viewer_of_request(request: Any) -> Viewer | None:
    """An HTTP stream's viewer (api/endpoint.py authenticated it: bearer token, else session)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    raw = bearer_from_header(request.headers.get("Authorization"))
    if raw:
        return Viewer(Credential("token", hash_token(raw)), str(user.pk))
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None) if session is not None else None
    return Viewer(Credential("session", key), str(user.pk)) if key else None


# ------------------------------------------------------------------ the check
def endings(viewers: Collection[Viewer]) -> dict[Viewer, Ending]:
    """The viewers that may no longer watch, and why: three queries, whatever their number."""
    tokens = {v.credential.value for v in viewers if v.credential.kind == "token"}
    keys = {v.credential.value for v in viewers if v.credential.kind == "session"}
    token_users: dict[str, str] = {}
    if tokens:
        rows = ApiToken.valid().filter(token_hash__in=tokens).values_list("token_hash", "user_id")
        token_users = {token_hash: str(user_id) for token_hash, user_id in rows}
    sessions: dict[str, dict] = {}
    if keys:
        rows = Session.objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
        store = Session.get_session_store_class()()
        sessions = {key: store.decode(data) for key, data in rows.values_list("pk", "session_data")}
    users = {str(user.pk): user for user in _users_with_right({v.user_id for v in viewers})}
    out: dict[Viewer, Ending] = {}
    for viewer in viewers:
        ending = _ending(viewer, users.get(viewer.user_id), token_users, sessions)
        if ending is not None:
            out[viewer] = ending
    return out


def _users_with_right(user_ids: set[str]) -> list[Any]:
    """The users, each with `may_view`: active and holding VIEW_RUN (Django's ModelBackend rule,
    as `has_perm` decides it at connect: own or group permission, or superuser)."""
    model = get_user_model()
    allowed = ModelBackend().with_perm(VIEW_RUN, is_active=True, include_superusers=True)
    return list(
        model._default_manager.filter(pk__in=user_ids)
        .only("pk", "password", "is_active")
        .annotate(may_view=Exists(allowed.filter(pk=OuterRef("pk"))))
    )


def _ending(
    viewer: Viewer, user: Any, token_users: dict[str, str], sessions: dict[str, dict]
) -> Ending | None:
    if user is None or not user.is_active:
        return Ending(CREDENTIAL_GONE, "account deactivated")
    credential = viewer.credential
    if credential.kind == "token":
        if token_users.get(credential.value) != viewer.user_id:
            return Ending(CREDENTIAL_GONE, "token revoked or expired")
    elif not _session_holds(sessions.get(credential.value), viewer.user_id, user):
        return Ending(CREDENTIAL_GONE, "signed out")
    if not user.may_view:
        return Ending(RIGHT_GONE, f"permission {VIEW_RUN} withdrawn")
    return None


def _session_holds(data: dict | None, user_id: str, user: Any) -> bool:
    """The session still signs `user` in, by the rules of `django.contrib.auth.get_user`."""
    if not data or str(data.get(SESSION_KEY)) != user_id:
        return False
    if data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS:
        return False
    signed = data.get(HASH_SESSION_KEY)
    if not signed:
        return False
    if constant_time_compare(signed, user.get_session_auth_hash()):
        return True
    return any(constant_time_compare(signed, h) for h in user.get_session_auth_fallback_hash())


# ------------------------------------------------------------------ the watch
class ViewerWatch:
    """The streams of one event loop by viewer, and the one task that rechecks them."""

    def __init__(self) -> None:
        self.ends: dict[Viewer, set[End]] = {}
        self.task: asyncio.Task | None = None

    def add(self, viewer: Viewer, end: End) -> None:
        self.ends.setdefault(viewer, set()).add(end)
        if self.task is None or self.task.done():
            # its own, empty context: the task outlives the request or socket that started it,
            # and must not run its reads on that request's thread (stream/http_handler.py)
            self.task = asyncio.get_running_loop().create_task(
                self.recheck_forever(), context=contextvars.Context()
            )

    def discard(self, viewer: Viewer, end: End) -> None:
        ends = self.ends.get(viewer)
        if ends is not None:
            ends.discard(end)
            if not ends:
                del self.ends[viewer]

    async def recheck_forever(self) -> None:
        loop = asyncio.get_running_loop()
        tick = loop.time()
        while self.ends:
            tick = max(tick + RECHECK_SECONDS, loop.time())  # fixed rate; a slow check skips
            await asyncio.sleep(tick - loop.time())
            watched = list(self.ends)
            if not watched:
                continue
            try:
                ended = await database_sync_to_async(endings)(watched)
            except Exception:  # a database blip: keep the streams, check again next time
                log.warning("viewer recheck failed", exc_info=True)
                continue
            for viewer, ending in ended.items():
                for end in self.ends.pop(viewer, set()):
                    end(ending)


_WATCHES: dict[int, ViewerWatch] = {}


def watch() -> ViewerWatch:
    """This event loop's watch (daphne has one loop; tests may run several)."""
    key = id(asyncio.get_running_loop())
    found = _WATCHES.get(key)
    if found is None:
        found = _WATCHES[key] = ViewerWatch()
    return found
