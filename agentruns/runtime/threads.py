"""The owner of a process's background threads: every thread of the project starts here.

A worker process carries, besides q2's own, the pool's run threads and its supervisor, the
model-stream loop, the nudge sender, the delta writer, the lease keeper, the run claimer, and in
`qcluster` the sweeper loop, the delivery loop (with its senders) and the retention loop. Each
is started through `process_threads().start(...)` with the way to stop it, so one place knows
what runs in the process (`names()`, for /metrics and tests) and stops it all together
(`stop_all`), last started first. Keyed by pid: a forked child (q2's workers) starts its own and
inherits none.

A background loop that is an object (the claimer, the sweeper, delivery and retention loops)
derives from `OwnedThread`: `start()` hands its `run` to the owner, `stop()` sets `stopped`,
which its loop watches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Background:
    name: str
    thread: threading.Thread
    stop: Callable[[], None] | None


class ProcessThreads:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: list[Background] = []

    def start(
        self,
        name: str,
        target: Callable[[], object],
        *,
        stop: Callable[[], None] | None = None,
        daemon: bool = True,
    ) -> threading.Thread:
        """Run `target` on a new thread named `name`; `stop` asks it to end (for `stop_all`)."""
        entry: Background | None = None

        def body() -> None:
            try:
                target()
            finally:
                with self._lock:
                    if entry in self._running:
                        self._running.remove(entry)

        thread = threading.Thread(target=body, name=name, daemon=daemon)
        entry = Background(name, thread, stop)
        with self._lock:
            self._running.append(entry)
        thread.start()
        return thread

    def executor(self, name: str, workers: int) -> ThreadPoolExecutor:
        """A pool of `workers` threads named `name-N`, shut down with the others by `stop_all`."""
        pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        marker = threading.Thread(name=f"{name} (executor)")  # never started: a registry entry
        with self._lock:
            self._running.append(Background(name, marker, lambda: pool.shutdown(wait=False)))
        return pool

    def names(self) -> list[str]:
        with self._lock:
            return [entry.name for entry in self._running]

    def stop_all(self, timeout: float = 5.0) -> list[str]:
        """Ask every thread to stop, last started first, and wait up to `timeout` seconds in
        all; returns the names of those still running."""
        with self._lock:
            entries = list(reversed(self._running))
        for entry in entries:
            if entry.stop is not None:
                try:
                    entry.stop()
                except Exception:
                    log.warning("stopping %s failed", entry.name, exc_info=True)
        with self._lock:  # executors are shut down: nothing of theirs is left to wait for
            self._running = [e for e in self._running if e.thread.ident is not None]
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        left = []
        for entry in entries:
            if entry.thread is current or entry.thread.ident is None:
                continue
            entry.thread.join(max(0.0, deadline - time.monotonic()))
            if entry.thread.is_alive():
                left.append(entry.name)
        return left


_owner: tuple[int, ProcessThreads] | None = None
_owner_lock = threading.Lock()


def process_threads() -> ProcessThreads:
    """This process's owner (a forked child gets its own, empty)."""
    global _owner
    with _owner_lock:
        if _owner is None or _owner[0] != os.getpid():
            _owner = (os.getpid(), ProcessThreads())
        return _owner[1]


class OwnedThread:
    """A background loop object whose thread the process's owner starts: subclasses define
    `run` (watching `stopped`) and a `name`; `start`, `join`, `is_alive` as on a Thread."""

    name = "background"
    daemon = True

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = process_threads().start(
            self.name, self.run, stop=self.stop, daemon=self.daemon
        )

    def stop(self) -> None:
        self.stopped.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
