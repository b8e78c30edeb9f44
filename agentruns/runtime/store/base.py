"""The durable store of runs: one interface, a PostgreSQL and a SQLite implementation.

Every write that appends events goes through here, because appending events is what keeps the
timeline gap-free: the run row's `last_seq` is bumped by the same statement that writes the
change, inside the transaction of that change, so concurrent writers queue on the run's row and
every committed seq is contiguous.

- `commit`: the executor's write, fenced on its lease (raises LeaseLost when the lease moved),
  renewing the lease and reading the cancel flag in the same round trip;
- `append`: everyone else's write (services, the sweeper, decisions), unfenced;
- `claim`: take a free lease (queued -> running, or a running run whose worker died);
- `create_run`: the new run and its first events;
- `commit_deltas`: the streamed text of many runs (a worker process's delta writer), each run
  fenced on its lease, in one transaction.

The backend is chosen once per process (`get_store`), like DBOS's system database: no
`vendor ==` branches in the code that uses it.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce

from agentruns.models import Run, RunStatus
from agentruns.runtime.events import EventSpec, LeaseLost
from agentruns.runtime.store.rows import WriteBatch


@dataclass(slots=True, frozen=True)
class InFlightCap:
    """`create_run` inserts the run only while `user_id` has fewer than `limit` runs queued or
    running, counted under a lock per user (PostgreSQL: an advisory lock of the inserting
    transaction; SQLite: its write lock), so concurrent starts cannot pass the count together."""

    user_id: Any
    limit: int
    # the start is alone in its transaction: far below the cap it need not wait for the user's
    # other starts (PostgreSQL: `pg_function`'s shared lock; InFlightNearCap when near it)
    shared: bool = False


class InFlightCapReached(Exception):
    """The start would exceed its `InFlightCap`: nothing was written."""


class InFlightNearCap(Exception):
    """A `shared` start found its user near the cap, where only an exact count may decide:
    nothing was written; start again with `shared` False."""


@dataclass(slots=True, frozen=True)
class RunDeltas:
    """Events of one run for `commit_deltas`, written only while `owner` holds its lease."""

    run_id: uuid.UUID
    owner: str
    lease_expires_at: datetime
    events: list[EventSpec]


class RunStore(ABC):
    # `create_run` is one statement, atomic without a transaction around it
    create_is_one_statement = False

    def load_run(self, run_id: uuid.UUID) -> Run:
        """The run's row, as an executor reads it once its lease is taken (Run.DoesNotExist when
        it is gone)."""
        return Run.objects.get(id=run_id)

    @abstractmethod
    def commit(
        self,
        run_id: uuid.UUID,
        owner: str,
        events: list[EventSpec],
        *,
        now: datetime,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
        batch: WriteBatch | None = None,
        end_transaction: bool = False,
    ) -> tuple[int, bool]:
        """The fenced run update + events + the rows in `batch`, atomically.

        Returns (last seq, cancel_requested). `end_transaction`: the caller's outermost atomic
        block ends right after this call (a backend may send the COMMIT along)."""

    @abstractmethod
    def append(
        self,
        run_id: uuid.UUID | str,
        events: list[EventSpec],
        *,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
    ) -> int:
        """Append events (and change run fields) for a writer that holds no lease. Must run
        inside `transaction.atomic()`; viewers are nudged on commit. Returns the last seq."""

    @abstractmethod
    def create_run(
        self,
        run: Run,
        events: list[EventSpec],
        *,
        owner: str | None,
        now: datetime,
        notify: str | None = None,
        in_flight: InFlightCap | None = None,
    ) -> int:
        """Insert `run` (already leased by `owner` when given) with its first events; `notify`:
        a channel NOTIFYed by the same statement (PostgreSQL only: `dispatch/claims.py`);
        `in_flight`: the starter's cap, checked with the insert (InFlightCapReached)."""

    def commit_deltas(
        self, deltas: list[RunDeltas], *, now: datetime
    ) -> dict[uuid.UUID, tuple[int, bool]]:
        """The events of many runs in one transaction, each run fenced on its lease (which is
        renewed): {run: (last seq, cancel_requested)}; a run missing from it lost its lease
        and none of its events were written."""
        done: dict[uuid.UUID, tuple[int, bool]] = {}
        with transaction.atomic():
            for delta in deltas:
                try:
                    done[delta.run_id] = self.commit(
                        delta.run_id,
                        delta.owner,
                        delta.events,
                        now=now,
                        set_fields={"lease_expires_at": delta.lease_expires_at},
                    )
                except LeaseLost:
                    pass
        return done

    def claim(
        self,
        run_id: uuid.UUID,
        owner: str,
        events: list[EventSpec],
        *,
        lease: dict[str, Any],
        now: datetime,
    ) -> bool:
        """Take the run's lease if it is free: a queued run that is due becomes running (with
        `events`), a running run whose lease expired (its worker died) is only re-leased.

        Due: its `enqueued_at` has come. A run backing off (a model's `Retry-After`, a retry's
        backoff) is queued with `enqueued_at` at the end of its wait and its own doorbell rung
        for then; a doorbell rung for it earlier (doorbells are at-least-once: one left in the
        queue when a claimer took the run first, before it backed off again) finds nothing."""
        free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        due = Q(enqueued_at__isnull=True) | Q(enqueued_at__lte=now)
        with transaction.atomic():
            queued = Run.objects.filter(free, due, id=run_id, status=RunStatus.QUEUED)
            # a run in its concurrency key's line is not admitted: a doorbell for it finds nothing
            fresh = queued.filter(waiting_behind__isnull=True).update(
                status=RunStatus.RUNNING, started_at=Coalesce("started_at", Value(now)), **lease
            )
            if fresh:
                self.commit(run_id, owner, events, now=now, set_fields=dict(lease))
                return True
            return self.relet_abandoned(run_id, lease=lease, now=now)

    @staticmethod
    def relet_abandoned(run_id: uuid.UUID, *, lease: dict[str, Any], now: datetime) -> bool:
        """A running run whose lease expired (its worker died) changes hands; no event: it was
        running and still is."""
        free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        return bool(Run.objects.filter(free, id=run_id, status=RunStatus.RUNNING).update(**lease))
