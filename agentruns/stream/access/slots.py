"""The caps every long-lived stream counts against: run sockets, chat SSE streams and their
resume streams alike, in one count.

Each web process admits at most AGENTRUNS_SOCKETS_PER_PROCESS streams, and at most
AGENTRUNS_SOCKETS_PER_USER of one user (the settings keep the names they had when they capped
sockets alone). One more is refused at once:
- a socket is accepted and closed with 4013 ("try again later"), which the run page retries with
  a growing wait (RFC 6455's own code for it is 1013, but daphne's websocket library, autobahn,
  sends only 1000 and 3000-4999, so the app sends 4000 + 1013);
- an SSE request is a 429 with `Retry-After`, before its view runs: a refused chat request starts
  nothing and decides nothing.
A stream holds its slot from the moment it is admitted until it ends, however it ends.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from agentruns.conf import conf
from agentruns.runtime.access.quotas import QuotaExceeded

TRY_LATER = 4013  # "try again later" (1013 in RFC 6455, which autobahn will not send)
# what a refused SSE request is told to wait: streams end as runs park or finish, which takes
# seconds, and a client that retries sooner only finds the same count
RETRY_AFTER_SECONDS = 5


class Slot:
    """One admitted stream's place. `release()` gives it back once, however often it is called
    (a stream's own end, its response's close and its garbage collection may all call it)."""

    def __init__(self, slots: StreamSlots, user_id: Any) -> None:
        self._slots = slots
        self.user_id = user_id
        self._held = True

    def release(self) -> None:
        with self._slots.lock:
            if not self._held:
                return
            self._held = False
            self._slots.give_back(self.user_id)


class StreamSlots:
    """Open streams in this process: in all and per user. Taken in the event loop (sockets) and
    in request threads (SSE views), given back in either, or by the garbage collector: one
    re-entrant lock (a collection inside `take` may release another slot in the same thread)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.per_user: Counter[Any] = Counter()
        self.total = 0

    def take(self, user_id: Any) -> Slot:
        """A slot for `user_id`; QuotaExceeded (the reason, and when to try again) when none."""
        process_cap, user_cap = conf.SOCKETS_PER_PROCESS, conf.SOCKETS_PER_USER
        with self.lock:
            if process_cap and self.total >= process_cap:
                raise QuotaExceeded(
                    "this server holds as many streams as it may: try again later",
                    RETRY_AFTER_SECONDS,
                )
            if user_cap and self.per_user[user_id] >= user_cap:
                raise QuotaExceeded(
                    f"you have {user_cap} streams open here already (sockets and chat streams): "
                    "close some or try again later",
                    RETRY_AFTER_SECONDS,
                )
            self.per_user[user_id] += 1
            self.total += 1
        return Slot(self, user_id)

    def give_back(self, user_id: Any) -> None:
        with self.lock:
            self.total -= 1
            self.per_user[user_id] -= 1
            if self.per_user[user_id] <= 0:
                del self.per_user[user_id]


SLOTS = StreamSlots()
