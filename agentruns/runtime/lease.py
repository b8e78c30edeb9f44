"""The lease heartbeat: one keeper thread per process renews the leases of its executors."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from agentruns.models import Run

log = logging.getLogger(__name__)


class Heartbeat:
    """Extends a run's lease every TTL/3 while its executor works (every engine commit extends it
    as well); `lost` is set when the lease turns out to belong to someone else.

    Registered with the process's one `_LeaseKeeper` thread: a run costs a dict entry, not a
    thread of its own (starting and joining one per run cost ~0.2 ms, measured)."""

    def __init__(self, run_id: uuid.UUID, owner: str, ttl: float) -> None:
        self.run_id, self.owner, self.ttl = run_id, owner, ttl
        self.lost = threading.Event()
        self.due = 0.0

    def start(self) -> None:
        self.due = time.monotonic() + self.ttl / 3
        _keeper().add(self)

    def stop(self) -> None:
        _keeper().remove(self)

    def renew(self) -> None:
        expires = timezone.now() + timedelta(seconds=self.ttl)
        held = Run.objects.filter(id=self.run_id, lease_owner=self.owner).update(
            lease_expires_at=expires
        )
        if not held:
            self.lost.set()


IDLE_POLL_SECONDS = 1.0


class _LeaseKeeper(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.beats: set[Heartbeat] = set()
        self.sleeps_until = float("inf")

    def add(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.add(beat)
            if beat.due < self.sleeps_until:  # otherwise it is renewed in time anyway
                self.wake.set()

    def remove(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.discard(beat)

    def run(self) -> None:
        while True:
            self.wake.clear()
            with self.lock:
                beats = list(self.beats)
            now = time.monotonic()
            renewed = False
            for beat in beats:
                if beat.due > now or beat.lost.is_set():
                    continue
                try:
                    with self.lock:
                        if beat not in self.beats:  # stopped meanwhile: its run is done
                            continue
                    renewed = True
                    beat.renew()
                except Exception:
                    log.warning("lease heartbeat failed for run %s", beat.run_id, exc_info=True)
                beat.due = time.monotonic() + beat.ttl / 3
            if renewed:
                # renewals are rare (only steps longer than TTL/3): no connection held in between
                connection.close()
            with self.lock:
                # at most IDLE_POLL_SECONDS, so that registering a run rarely has to wake us
                self.sleeps_until = min(
                    [b.due for b in self.beats if not b.lost.is_set()]
                    + [time.monotonic() + IDLE_POLL_SECONDS]
                )
            self.wake.wait(max(0.0, self.sleeps_until - time.monotonic()))


_keeper_of: tuple[int, _LeaseKeeper] | None = None
_keeper_lock = threading.Lock()


def _keeper() -> _LeaseKeeper:
    """The process's keeper thread (keyed by pid: a forked worker starts its own)."""
    global _keeper_of
    with _keeper_lock:
        if _keeper_of is None or _keeper_of[0] != os.getpid():
            keeper = _LeaseKeeper()
            keeper.start()
            _keeper_of = (os.getpid(), keeper)
        return _keeper_of[1]
