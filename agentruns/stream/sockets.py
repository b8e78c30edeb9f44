"""What long-lived connections (run sockets, the chat's SSE streams) hold, and how they end.

Slots: each web process admits at most AGENTRUNS_SOCKETS_PER_PROCESS run sockets, and at most
AGENTRUNS_SOCKETS_PER_USER of one user; one more is accepted and closed at once with 4013
("try again later"), which the run page retries with a growing wait. (RFC 6455's own code for
that is 1013, but daphne's websocket library, autobahn, refuses to send any close code but 1000
and 3000-4999, so the app sends 4000 + 1013; the page treats both alike.)

Credentials: a connection stays open only while what opened it is valid: its bearer token (not
revoked, not expired, its user active) or its session (not signed out, not expired). One task
per process and event loop checks every open connection's credential in one query per kind
every SOCKET_RECHECK_SECONDS, whatever the number of connections (400 sockets of one token are
one row to look up, not 400 queries), and ends the connections of any that lapsed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.sessions.models import Session
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import ApiToken
from agentruns.tokens import SOCKET_RECHECK_SECONDS, bearer_from_header, hash_token

log = logging.getLogger(__name__)

TRY_LATER = 4013  # "try again later" (1013 in RFC 6455, which autobahn will not send)


# ------------------------------------------------------------------ slots
class SocketSlots:
    """Open run sockets in this process: in all and per user."""

    def __init__(self) -> None:
        self.per_user: Counter[Any] = Counter()
        self.total = 0

    def take(self, user_id: Any) -> str | None:
        """Take a slot for `user_id`; a refusal's reason when there is none."""
        process_cap, user_cap = conf.SOCKETS_PER_PROCESS, conf.SOCKETS_PER_USER
        if process_cap and self.total >= process_cap:
            return "this server holds as many sockets as it may: try again later"
        if user_cap and self.per_user[user_id] >= user_cap:
            return f"you have {user_cap} sockets open here already: close some or try later"
        self.per_user[user_id] += 1
        self.total += 1
        return None

    def give_back(self, user_id: Any) -> None:
        self.total -= 1
        self.per_user[user_id] -= 1
        if self.per_user[user_id] <= 0:
            del self.per_user[user_id]


SLOTS = SocketSlots()


# ------------------------------------------------------------------ credentials
@dataclass(frozen=True)
class Credential:
    kind: str  # "token" (value: its SHA-256) or "session" (value: the session key)
    value: str


def credential_of_scope(scope: dict) -> Credential | None:
    """What authenticated a socket (stream/auth.py puts a bearer token in `auth_token`)."""
    if scope.get("auth_token"):
        return Credential("token", hash_token(scope["auth_token"].strip()))
    session = scope.get("session")
    key = getattr(session, "session_key", None) if session is not None else None
    return Credential("session", key) if key else None


def credential_of_request(request: Any) -> Credential | None:
    raw = bearer_from_header(request.headers.get("Authorization"))
    if raw:
        return Credential("token", hash_token(raw))
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None) if session is not None else None
    return Credential("session", key) if key else None


def _still_valid(tokens: list[str], sessions: list[str]) -> set[Credential]:
    valid: set[Credential] = set()
    if tokens:
        rows = ApiToken.valid().filter(token_hash__in=tokens).values_list("token_hash", flat=True)
        valid.update(Credential("token", value) for value in rows)
    if sessions:
        rows = Session.objects.filter(
            session_key__in=sessions, expire_date__gt=timezone.now()
        ).values_list("session_key", flat=True)
        valid.update(Credential("session", value) for value in rows)
    return valid


class CredentialWatch:
    """The connections of one event loop by credential, and the one task that rechecks them."""

    def __init__(self) -> None:
        self.ends: dict[Credential, set[Callable[[], None]]] = {}
        self.task: asyncio.Task | None = None

    def add(self, credential: Credential, end: Callable[[], None]) -> None:
        self.ends.setdefault(credential, set()).add(end)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.recheck_forever())

    def discard(self, credential: Credential, end: Callable[[], None]) -> None:
        ends = self.ends.get(credential)
        if ends is not None:
            ends.discard(end)
            if not ends:
                del self.ends[credential]

    async def recheck_forever(self) -> None:
        while self.ends:
            await asyncio.sleep(SOCKET_RECHECK_SECONDS)
            watched = list(self.ends)
            tokens = [c.value for c in watched if c.kind == "token"]
            sessions = [c.value for c in watched if c.kind == "session"]
            try:
                valid = await database_sync_to_async(_still_valid)(tokens, sessions)
            except Exception:  # a database blip: keep the connections, check again next time
                log.warning("credential recheck failed", exc_info=True)
                continue
            for credential in watched:
                if credential not in valid:
                    for end in self.ends.pop(credential, set()):
                        end()


_WATCHES: dict[int, CredentialWatch] = {}


def watch() -> CredentialWatch:
    """This event loop's watch (daphne has one loop; tests may run several)."""
    key = id(asyncio.get_running_loop())
    found = _WATCHES.get(key)
    if found is None:
        found = _WATCHES[key] = CredentialWatch()
    return found


def lapsed_reason(credential: Credential) -> str:
    return "token revoked or expired" if credential.kind == "token" else "signed out"


async def ended_with_credential(
    chunks: AsyncIterator[bytes], credential: Credential | None
) -> AsyncIterator[bytes]:
    """An SSE body that ends (with an AI SDK `error` chunk) within SOCKET_RECHECK_SECONDS of its
    credential lapsing, even while the stream itself waits for the run."""
    if credential is None:
        async for chunk in chunks:
            yield chunk
        return
    lapsed = asyncio.Event()
    own = watch()
    own.add(credential, lapsed.set)
    upstream = chunks.__aiter__()
    stop = asyncio.ensure_future(lapsed.wait())
    following: asyncio.Future | None = None
    try:
        while True:
            following = asyncio.ensure_future(upstream.__anext__())
            await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            if following.done():
                try:
                    chunk = following.result()
                except StopAsyncIteration:
                    return
                yield chunk
                continue
            following.cancel()  # the stream's own cleanup (leaving the run's feed) runs now
            error = {"type": "error", "errorText": lapsed_reason(credential)}
            yield f"data: {json.dumps(error)}\n\n".encode()
            return
    finally:  # also when the client went away (the server closes this generator)
        stop.cancel()
        if following is not None and not following.done():
            following.cancel()
        own.discard(credential, lapsed.set)
