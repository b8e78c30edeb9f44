"""How `qcluster` stops: its main process is the cluster's one stop switch.

The cluster is a tree of forked processes in one process group: the main process (the command),
q2's sentinel, and the sentinel's workers, pusher and monitor. SIGTERM or SIGINT to the main
process drains it: every worker's run pool hands its runs over (`pool.py`), then q2 stops. The
same signal often reaches every process at once, though: systemd's default
`KillMode=control-group` signals each process of the unit, Docker and Kubernetes do through an
init that signals the group, and a terminal's Ctrl-C signals the foreground group. q2's children
ignore SIGINT but keep SIGTERM's default action, so a SIGTERM to the group killed the sentinel
and every worker on the spot (runs cut mid-step, their leases left to expire), and the main
process then hung for good in q2's stop: `stop_event.set()` waits for the dead sentinel to
acknowledge the wake-up it was waiting for (multiprocessing's `Condition.notify_all`).

Here every child of the cluster ignores SIGTERM and SIGINT while the main process lives (it is
the child's parent or grandparent), so a signal to the group stops the cluster exactly as a signal
to the main process does; a child whose main process is gone (an orphan: the main process was
SIGKILLed) takes the default action, as before. The sentinel is
forked with both signals blocked (`children_born_deaf`), so no child ever runs the main
process's own handler; it installs its handler and unblocks them, and its children inherit that.
Because a child no longer dies of SIGTERM, what q2 ended with SIGTERM is killed instead: a
worker whose task outlived q2's `timeout`, and children still alive when the sentinel exits
(multiprocessing would SIGTERM them and wait forever).

Written against django-q2 1.11 (pinned in pyproject.toml).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_q import cluster as q2_cluster

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# the cluster's main process (`qcluster`), noted before it forks
_main_pid: int | None = None


def _parent_of(pid: int) -> int:
    """`pid`'s parent (Linux's /proc); 0 when that cannot be read (the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _main_process_lives() -> bool:
    """Whether this process still descends from the main process: an orphan is re-parented to
    an init or a subreaper, so no pid reuse can fake it."""
    pid = os.getppid()
    for _ in range(3):  # main -> sentinel -> worker, pusher, monitor
        if pid == _main_pid:
            return True
        if pid <= 1:
            return False
        pid = _parent_of(pid)
    return False


def _ignore_while_the_main_process_lives(signum: int, frame: Any) -> None:
    """A child's SIGTERM/SIGINT: the main process got it too (a signal to the group) or is not
    stopping (a signal to this process alone): either way not this process's to act on."""
    if _main_process_lives():
        return
    signal.signal(signum, signal.SIG_DFL)  # an orphan: die of it, as without this module
    os.kill(os.getpid(), signum)


def ignore_stop_signals_in_this_child() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _ignore_while_the_main_process_lives)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class Sentinel(q2_cluster.Sentinel):
    """q2's sentinel with the cluster's stop signals left to the main process."""

    def __init__(
        self,
        stop_event: Any,
        start_event: Any,
        cluster_id: Any,
        broker: Any = None,
        timeout: Any = None,
        start: bool = True,
    ) -> None:
        # q2's __init__ sets SIGINT ignored and SIGTERM to its default, then (with `start`) runs
        # the cluster until it stops: ours goes in between
        super().__init__(stop_event, start_event, cluster_id, broker, timeout, start=False)
        ignore_stop_signals_in_this_child()
        if start:
            self.start()

    def reincarnate(self, process: Any) -> None:
        timer = getattr(process, "timer", None)
        if timer is not None and timer.value == 0 and process.is_alive():
            process.kill()  # q2 terminates a timed-out worker with SIGTERM, which it now ignores
        super().reincarnate(process)

    def stop(self) -> None:
        super().stop()
        # q2 waits for its children but gives up on a stuck monitor after `timeout`; the
        # process's exit would then SIGTERM the daemonic ones and wait for them forever
        for child in [self.monitor, self.pusher, *self.pool]:
            if child is not None and child.is_alive():
                child.kill()


@contextmanager
def children_born_deaf() -> Iterator[None]:
    """Around the sentinel's fork (q2's `Cluster.start`): the child starts with SIGTERM and
    SIGINT blocked, so it never runs this process's handler before it has its own."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def install() -> None:
    """In `qcluster`, before the cluster starts: q2 forks our sentinel."""
    global _main_pid
    _main_pid = os.getpid()
    q2_cluster.Sentinel = Sentinel  # type: ignore[misc]  # q2's Cluster.start looks it up by name
