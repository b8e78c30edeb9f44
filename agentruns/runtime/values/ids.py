"""Names the runtime hands out: idempotency keys of steps, identities of workers."""

from __future__ import annotations

import os
import socket
import time
import uuid


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): 48 bits of Unix milliseconds, then random bits
    (Python 3.14 has `uuid.uuid7`; this is the same layout)."""
    millis = time.time_ns() // 1_000_000 & (1 << 48) - 1
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 + 62 used
    value = millis << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64 | 0b10 << 62
    return uuid.UUID(int=value | rand & (1 << 62) - 1)


def step_key(run_id: uuid.UUID, step_id: uuid.UUID) -> str:
    """The idempotency key a step sends to the outside world, on every attempt."""
    return f"run-{run_id.hex[:12]}-step-{step_id.hex}"


def worker_name() -> str:
    """This process, as people read it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_id() -> str:
    """A lease owner: this process plus a random tag, unique for every executor it starts."""
    return f"{worker_name()}:{uuid.uuid4().hex[:6]}"


def actor_name(user: object) -> str | None:
    """Who did something, for the timeline and the audit (None: the system)."""
    return user.get_username() if user is not None else None  # type: ignore[attr-defined]


MAX_ID_DIGITS = 18  # fits a 64-bit BigAutoField


class BadId(ValueError):
    """Not one of this app's ids: only ASCII digits are ("²" and "١٤" are digits to Python)."""


def parse_id(raw: object, *, what: str = "id") -> int:
    """The one parser of ids that arrive as text (forms, chat parts, cursors): 1 to 18 ASCII
    digits, no sign, no spaces. Anything else is BadId, which callers answer with a 4xx."""
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if (
        not isinstance(text, str)
        or not 0 < len(text) <= MAX_ID_DIGITS
        or not text.isascii()
        or not text.isdigit()
    ):
        raise BadId(f"{what} {raw!r} is not an id (1 to {MAX_ID_DIGITS} ASCII digits)")
    return int(text)


def parse_versioned_id(raw: object, *, what: str = "id") -> tuple[int, int | None]:
    """`"14"` -> (14, None), `"14.3"` -> (14, 3): an inbox item and the version of its proposal
    the person saw (approvals' versioned decisions)."""
    text = raw if isinstance(raw, str) else str(raw)
    head, dot, tail = text.partition(".")
    item = parse_id(head, what=what)
    return item, parse_id(tail, what=f"{what} version") if dot else None


def is_uuid(raw: object) -> bool:
    """`raw` is a UUID's text (a step's or a run's id), so a lookup by it cannot fail."""
    try:
        uuid.UUID(str(raw))
    except ValueError:
        return False
    return isinstance(raw, str)
