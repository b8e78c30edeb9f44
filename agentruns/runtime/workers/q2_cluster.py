"""One fix to django-q2's cluster that runs in flight on threads make necessary.

q2's worker processes share one multiprocessing queue of tasks. An idle worker waits in
`Queue.get()` holding the queue's reader lock (a semaphore shared by all processes) until a
task arrives. A worker process killed right then (SIGKILL, the OOM killer, a failpoint) never
releases it: every other worker, and the one q2 respawns, blocks on it forever and the cluster
stops taking tasks (django-q2 issue #23, "When the next-in-line worker dies, the entire cluster
stops processing tasks"). With one task per process that window was rare: a process died while
*executing* its task, not while waiting. Now the q2 task only hands its run to the process's
pool and returns, so the process waits in `get()` while its threads execute dozens of runs, and
a crash of any of them lands in the window.

The fix: the queue records which process waits in `get()` holding the lock
(`GuardedQueue.reader`), and when q2's sentinel finds a dead process it releases the lock on
the dead one's behalf before respawning it. Installed by `qcluster` before q2 forks
(`install`); written against django-q2 1.11 (pinned in pyproject.toml).
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.reduction import ForkingPickler
from typing import Any

from django_q import cluster as q2_cluster
from django_q.queues import Queue


class GuardedQueue(Queue):
    """q2's queue, plus the pid of the process that waits in `get()` holding the reader lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reader = multiprocessing.get_context().Value("i", 0, lock=False)

    def __getstate__(self) -> tuple:
        return (*super().__getstate__(), self.reader)

    def __setstate__(self, state: tuple) -> None:
        super().__setstate__(state[:-1])
        self.reader = state[-1]

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not (block and timeout is None):  # q2 only blocks; anything else as before
            return super().get(block, timeout)
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        # multiprocessing.Queue.get's blocking path, with the holder written down
        with self._rlock:
            self.reader.value = os.getpid()
            try:
                data = self._recv_bytes()
            finally:
                self.reader.value = 0
        self._sem.release()
        self.size.increment(-1)
        return ForkingPickler.loads(data)

    def release_dead_reader(self, pid: int) -> bool:
        """The process `pid` died: if it held the reader lock, release it (True)."""
        if pid and self.reader.value == pid:
            self.reader.value = 0
            self._rlock.release()
            return True
        return False


_q2_reincarnate = q2_cluster.Sentinel.reincarnate


def _reincarnate(sentinel: Any, process: Any) -> None:
    if process is not None and not process.is_alive():
        for shared in (sentinel.task_queue, sentinel.result_queue):
            if isinstance(shared, GuardedQueue) and shared.release_dead_reader(process.pid):
                q2_cluster.logger.warning(
                    "released the queue lock held by dead process %s", process.pid
                )
    _q2_reincarnate(sentinel, process)


def install() -> None:
    """Before the cluster starts: the sentinel (forked from this process) builds its queues from
    `GuardedQueue` and frees a dead worker's lock when it respawns it."""
    q2_cluster.Queue = GuardedQueue
    q2_cluster.Sentinel.reincarnate = _reincarnate
