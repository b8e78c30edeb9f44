"""One writer of streamed model text per worker process: the deltas of every run the process
carries go out together, one multi-row commit per flush tick (`RunStore.commit_deltas`), instead
of one commit per run per tick (issue 22 item 4).

A model attempt's first delta is still the executor's own commit (the step goes in as running
with its attempt row, and the viewer sees text at once); from then on its text goes into a
`DeltaFeed` that the writer drains every `AGENTRUNS_DELTA_FLUSH_MS` (earlier when one feed holds
`AGENTRUNS_DELTA_FLUSH_CHARS`). The stream's promises (DESIGN.md 5) hold because:

- seqs: the writer's statement bumps each run's `last_seq` and inserts that run's events in one
  transaction, fenced on the executor's lease, exactly like an executor commit;
- order: the executor closes its feed (`DeltaFeed.close`) before its next own commit; closing
  waits for a flush in flight and hands back the text not yet written, which the executor puts
  in that commit, so no delta of an attempt lands after the step's result;
- a crash loses at most the text of the last tick (the attempt is then superseded anyway), and
  a flush that failed stops the feed: the executor raises at its next delta (LeaseLost, or the
  outage that weathers its slice), so an attempt's text never has a piece missing in the middle.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from agentruns.conf import conf
from agentruns.runtime import writer
from agentruns.runtime.dispatch import connections
from agentruns.runtime.events import EventType, LeaseLost
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.store.base import RunDeltas
from agentruns.runtime.threads import process_threads

log = logging.getLogger(__name__)


class DeltaFeed:
    """The streamed text of one model attempt, waiting for the process's next flush tick.

    Its fields are the writer's and the executor's meeting point: read and changed under the
    writer's lock only."""

    def __init__(
        self,
        writer: DeltaWriter,
        run_id: uuid.UUID,
        owner: str,
        step: int,
        attempt: int,
        on_committed: Callable[[bool], None],
    ) -> None:
        self.writer, self.run_id, self.owner = writer, run_id, owner
        self.step, self.attempt = step, attempt
        self.on_committed = on_committed  # (cancel_requested) after each flush of this feed
        self.pending: list[str] = []
        self.pending_chars = 0
        self.in_flight = False
        self.closed = False
        self.failure: BaseException | None = None

    def add(self, text: str) -> None:
        """Queue `text` for the next tick; raises what stopped an earlier flush of this feed."""
        self.writer.add(self, text)

    def close(self, *, raise_failure: bool = True) -> str:
        """Stop the feed once the flush in flight (if any) is written; returns the text no flush
        took, for the executor's own commit. Raises what stopped a flush of this feed (unless the
        attempt already failed: `raise_failure=False` keeps its own error)."""
        return self.writer.close(self, raise_failure=raise_failure)

    def close_now(self, *, raise_failure: bool = True) -> str | None:
        """`close` when no flush of this feed is in flight (None: one is, so closing would wait
        for its commit)."""
        return self.writer.close(self, raise_failure=raise_failure, wait=False)

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure


class DeltaWriter:
    """The process's writer thread and the feeds it drains (`delta_writer()`)."""

    def __init__(self, tick_s: float, flush_chars: int) -> None:
        self.tick_s, self.flush_chars = tick_s, flush_chars
        self.lock = threading.Condition()
        self.ready: dict[int, DeltaFeed] = {}  # feeds holding text, by id()
        self.early = False  # a feed reached flush_chars: flush before the tick is up
        self.last_flush = 0.0
        self.stopped = False
        self.thread = process_threads().start("delta-writer", self._loop, stop=self.stop)

    def stop(self) -> None:
        """End the writer's thread (the process stops: its runs were handed over first)."""
        with self.lock:
            self.stopped = True
            self.lock.notify_all()

    def open(
        self,
        run_id: uuid.UUID,
        owner: str,
        step: int,
        attempt: int,
        on_committed: Callable[[bool], None],
    ) -> DeltaFeed:
        return DeltaFeed(self, run_id, owner, step, attempt, on_committed)

    def add(self, feed: DeltaFeed, text: str) -> None:
        with self.lock:
            feed.raise_failure()
            feed.pending.append(text)
            feed.pending_chars += len(text)
            # the writer is woken only when it must act sooner than its tick (its first text, a
            # full feed): a wake-up per delta was a thread switch per delta of every run
            wake = not self.ready or (not self.early and feed.pending_chars >= self.flush_chars)
            self.ready[id(feed)] = feed
            if feed.pending_chars >= self.flush_chars:
                self.early = True
            if wake:
                self.lock.notify_all()

    def close(
        self, feed: DeltaFeed, *, raise_failure: bool = True, wait: bool = True
    ) -> str | None:
        with self.lock:
            while feed.in_flight:
                if not wait:
                    return None
                self.lock.wait()
            feed.closed = True
            self.ready.pop(id(feed), None)
            if raise_failure:
                feed.raise_failure()
            text = "".join(feed.pending)
            feed.pending, feed.pending_chars = [], 0
            return text

    # ------------------------------------------------------------ the writer thread
    def _loop(self) -> None:
        while not self.stopped:
            try:
                taken = self._take()
                self._flush(taken)
            except Exception:  # the writer must outlive any one flush
                log.exception("delta writer: flush failed")

    def _take(self) -> list[tuple[DeltaFeed, str]]:
        """Wait for text and for the tick (or a full feed), then take every feed's text."""
        with self.lock:
            while not self.stopped:
                if not self.ready:
                    self.lock.wait()
                    continue
                due = self.last_flush + self.tick_s - time.monotonic()
                if due <= 0 or self.early:
                    break
                self.lock.wait(due)
            taken = []
            for feed in self.ready.values():
                if feed.closed or feed.failure is not None:
                    continue
                taken.append((feed, "".join(feed.pending)))
                feed.pending, feed.pending_chars, feed.in_flight = [], 0, True
            self.ready.clear()
            self.early = False
            self.last_flush = time.monotonic()
            return taken

    def _flush(self, taken: list[tuple[DeltaFeed, str]]) -> None:
        if not taken:
            return
        now = timezone.now()
        lease_until = now + timedelta(seconds=conf.LEASE_TTL_SECONDS)
        deltas = [
            RunDeltas(
                run_id=feed.run_id,
                owner=feed.owner,
                lease_expires_at=lease_until,
                events=[
                    (
                        EventType.MODEL_DELTA,
                        {"step": feed.step, "attempt": feed.attempt, "text": text},
                    )
                ],
            )
            for feed, text in taken
        ]
        try:
            results = writer.commit_deltas(deltas, now=now)
        except Exception as exc:
            self._failed(taken, exc)
            return
        connections.release()  # an idle writer holds no connection of the pool
        with self.lock:
            for feed, _ in taken:
                feed.in_flight = False
                result = results.get(feed.run_id)
                if result is None:  # its lease moved: the executor stops at its next delta
                    feed.failure = LeaseLost(str(feed.run_id))
                else:
                    feed.on_committed(result[1])
            self.lock.notify_all()

    def _failed(self, taken: list[tuple[DeltaFeed, str]], exc: Exception) -> None:
        """An outage stops every feed of the flush (their executors weather their slices); any
        other error leaves the text queued, in order, for the next tick or the executor's commit."""
        outage = is_infrastructure_error(exc)
        if outage:
            weather.outage_of(exc).noticed(exc, "the delta writer")
        else:
            log.warning("delta writer: flush failed, retried at the next tick: %r", exc)
        try:
            connection.close()  # a connection that saw the error: discarded
        except Exception:
            pass
        with self.lock:
            for feed, text in taken:
                feed.in_flight = False
                if outage:
                    feed.failure = exc
                elif not feed.closed:
                    feed.pending.insert(0, text)
                    feed.pending_chars += len(text)
                    self.ready[id(feed)] = feed
            self.lock.notify_all()


_writer: tuple[int, DeltaWriter] | None = None
_writer_lock = threading.Lock()


def delta_writer() -> DeltaWriter:
    """The writer of this process, started on first use (keyed by pid: a forked child, as
    django-q2's workers are, starts its own)."""
    global _writer
    with _writer_lock:
        if _writer is None or _writer[0] != os.getpid() or _writer[1].stopped:
            writer = DeltaWriter(conf.DELTA_FLUSH_MS / 1000.0, conf.DELTA_FLUSH_CHARS)
            _writer = (os.getpid(), writer)
        return _writer[1]
