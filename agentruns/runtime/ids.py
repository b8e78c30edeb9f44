"""Names the runtime hands out: idempotency keys of steps, identities of workers."""

from __future__ import annotations

import os
import socket
import uuid


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
    return getattr(user, "username", None) if user is not None else None
