"""Many runs in flight per worker process (DESIGN.md 4.2).

A django-q2 task (`tasks.advance_run`) only hands its run to this process's `RunPool` and
returns; the run executes as a task of the process's one event loop (`engine/lanes.py`: a model
stream or a tool's HTTP call waits without holding a thread or a database connection), its
blocking work on the process's few database and tool threads.
django-q2 stays the doorbell, the lease stays the truth: an executor still claims its run with
the conditional UPDATE, so a duplicated doorbell costs a slot for one failed claim. On
PostgreSQL most runs come from the process's claimer instead (`claimer.py`): already leased by a
batch claim, on slots it reserved (`reserve`, `start_claimed`).

Backpressure: with every slot taken, the hand-over waits (at most AGENTRUNS_HANDOVER_WAIT_SECONDS,
well inside q2's `timeout`) for one to free. Meanwhile this q2 worker takes no further task, so a
sibling process with room takes the next one from q2's shared queue and other clusters take the
rest from the broker; if no slot frees in time, the doorbell goes back to the broker for
whoever has room. Runs start roughly in the order they were queued: the broker hands tasks out
oldest first (`broker.py`) and each process serves its waiting hand-over first.

Lifecycle. When q2 stops this process the q2 worker loop returns while our threads still run;
the pool's supervisor (the only non-daemon thread, so the process waits for it) then takes no
new run and stops in phases of at most AGENTRUNS_DRAIN_SECONDS each:
- a `recycle` or `max_rss` (nothing is in a hurry): the runs in flight first get to finish;
- then every executor hands its run over at its next step boundary (queued again, doorbell
  rung: another process continues at once, not after the lease TTL). A SIGTERM of `qcluster`
  starts here, at once: it sets `cluster_stopping` (inherited by every forked process) before
  q2 even tells its workers;
- steps still running after that have their leases released in one statement and their runs
  rung, so the next worker recovers them by idempotency class, also without waiting for the TTL.
q2's `timeout` never fires on a hand-over (it returns within the wait), so q2 never kills a
process with runs in flight; SIGKILL is recovered by the leases.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import Run, WorkerHeartbeat
from agentruns.runtime.dispatch import connections
from agentruns.runtime.dispatch.lease import hand_back, release_leases
from agentruns.runtime.dispatch.queue import ADVANCE_TASK, enqueue
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.engine.lanes import process_loop, worker_lane
from agentruns.runtime.outages import process_health, weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import process_threads
from agentruns.runtime.values.ids import worker_name

log = logging.getLogger(__name__)

TAKE_AT_MOST = 50  # doorbells a hand-over takes from the queue behind its own, per statement
HEARTBEAT_SECONDS = 2.0  # how often a pool reports its runs in flight (WorkerHeartbeat)
CHANGE_REPORT_SECONDS = 1.0  # ... and sooner when that number changed, at most this often
STOP_POLL_SECONDS = 0.2  # how soon the supervisor notices that the process stops

# a flag in shared memory, made in the `qcluster` process before it forks (`expect_cluster_stop`)
# and so shared by every process of the cluster; set by its SIGTERM/SIGINT handler. Read and set
# without a lock: a multiprocessing Event's lock, held by a process killed inside `is_set()`,
# would hang the stop of every other process for good
cluster_stopping: Any = None


class RunPool:
    def __init__(self, capacity: int, *, name: str | None = None, supervise: bool = True) -> None:
        self.capacity = capacity
        self.name = name or f"{WorkerHeartbeat.POOL_PREFIX}{worker_name()}"
        # set when the process stops: no new runs; `drain`: executors hand over at their next
        # step boundary; `drained`: done
        self.closing = threading.Event()
        self.drain = threading.Event()
        self.drained = threading.Event()
        self._cond = threading.Condition()
        self._busy = 0  # slots taken (handed over, not yet finished)
        self._executors: set[RunExecutor] = set()
        self.loop, _ = process_loop()
        threads = process_threads()
        if supervise:
            # non-daemon: the process exits only after its drain (threading joins it at exit)
            threads.start("run-pool", self._supervise, daemon=False)

    # ---------------------------------------------------------------- taking runs
    @property
    def in_flight(self) -> int:
        return self._busy

    def hand_over(self, run_id: str, wait: float | None = None) -> str:
        """Give the run a slot (waiting up to `wait` seconds for one) and return at once:
        "started", or "requeued" when the process is full or stopping (the doorbell goes back
        to the broker)."""
        wait = handover_wait() if wait is None else wait
        deadline = time.monotonic() + wait
        with self._cond:
            while not self.closing.is_set() and self._busy >= self.capacity:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            accepted = not self.closing.is_set() and self._busy < self.capacity
            if accepted:
                self._busy += 1
        if not accepted:
            try:
                enqueue(run_id)
            except Exception as exc:
                if not is_infrastructure_error(exc):
                    raise
                # the database is away: this doorbell is lost, the sweeper rings the run again
                weather.database.noticed(exc, "a hand-over")
            return "requeued"
        self._start(run_id, None, None)
        return "started"

    def reserve(self, most: int) -> int:
        """Take up to `most` free slots for a claim batch (0 when full or stopping)."""
        with self._cond:
            free = 0 if self.closing.is_set() else min(most, self.capacity - self._busy)
            free = max(free, 0)
            self._busy += free
        return free

    def unreserve(self, slots: int) -> None:
        """Give back reserved slots the claim did not fill."""
        if slots > 0:
            with self._cond:
                self._busy -= slots
                self._cond.notify_all()

    def start_claimed(self, run: Run) -> None:
        """Execute a run already leased (`run.lease_owner`) on a reserved slot; `run` is its row
        as the claim returned it."""
        self._start(str(run.id), run.lease_owner, run)

    def wait_for_free_slot(self, timeout: float) -> bool:
        with self._cond:
            if self._busy >= self.capacity and not self.closing.is_set():
                self._cond.wait(timeout)
            return self._busy < self.capacity and not self.closing.is_set()

    def take_waiting(self) -> int:
        """After a hand-over (in the q2 worker): take the doorbells queued behind it, as many as
        there are free slots, in one statement, and hand them over too. A burst of starts then
        costs a few statements instead of a trip through q2's pusher per run; a full process
        takes nothing, so it never hoards. Returns how many runs it took."""
        # q2's broker, imported only where q2 runs: q2 reads its settings on import
        from django_q.conf import Conf

        from agentruns.runtime.dispatch.broker import DoorbellBroker

        with self._cond:
            free = 0 if self.closing.is_set() else self.capacity - self._busy
        if free <= 0:
            return 0
        broker = DoorbellBroker(list_key=Conf.CLUSTER_NAME)
        taken: list[tuple[int, tuple]] = []
        try:
            taken = broker.take(min(free, TAKE_AT_MOST), ADVANCE_TASK)
            for _, args in taken:
                self.hand_over(str(args[0]), wait=0)  # no wait: only this thread adds runs
            broker.acknowledge_all([ack_id for ack_id, _ in taken])
        except Exception as exc:
            if not is_infrastructure_error(exc):
                raise
            # taken ones not acknowledged come back after q2's `retry`; their leases dedupe
            weather.database.noticed(exc, "a hand-over")
        finally:
            connection.close()  # the q2 worker waits for its next task without a connection
        return len(taken)

    def _start(self, run_id: str, owner: str | None, claimed: Run | None) -> None:
        """A run for a slot already taken: a doorbell's (no owner: its executor claims it) or
        one the process's claimer already leased (`claimer.py`), as a task of the loop."""
        coroutine = self._work(run_id, owner, claimed)
        try:
            self.loop.call_soon_threadsafe(self.loop.create_task, coroutine)
        except RuntimeError:  # the loop is gone (the process stops): the lease or sweep rings it
            coroutine.close()
            self._slot_freed(None)

    async def _work(self, run_id: str, owner: str | None, claimed: Run | None) -> None:
        executor = RunExecutor(run_id, owner, drain=self.drain)
        lane = worker_lane()
        with self._cond:
            self._executors.add(executor)
        try:
            if owner is None and self.closing.is_set():
                await lane.run(enqueue, run_id)  # taken just before the stop: give it back
            elif owner is None:
                await executor.advance_in(lane)
            elif self.closing.is_set():  # claimed just before the stop: release and ring
                await lane.run(release_leases, [(executor.run_id, owner)])
            else:
                await executor.advance_in(lane, claimed=claimed)
        except Exception as exc:  # advance_in contains engine errors; this is the doorbell's
            if is_infrastructure_error(exc):  # the give-back failed: the sweeper rings it
                weather.database.noticed(exc, f"run {run_id}")
                if owner is not None:  # our lease: the keeper releases it once it answers
                    hand_back(executor.run_id, owner)
            else:
                log.exception("run %s: could not be executed", run_id)
        finally:
            self._slot_freed(executor)

    def _slot_freed(self, executor: RunExecutor | None) -> None:
        with self._cond:
            self._executors.discard(executor)
            self._busy -= 1
            self._cond.notify_all()

    # ---------------------------------------------------------------- stopping
    def stop(self, grace: float | None = None, *, finish_first: bool = False) -> int:
        """Take no new run; with `finish_first`, let the runs in flight finish for up to `grace`
        seconds; then have every run handed over at its next step boundary, waiting up to
        `grace` seconds; then release the leases of the runs still mid-step. Returns how many
        were released."""
        grace = conf.DRAIN_SECONDS if grace is None else grace
        self.closing.set()
        with self._cond:
            self._cond.notify_all()  # a waiting hand-over gives its doorbell back now
        if finish_first:
            self._wait_idle(grace)
        self.drain.set()
        self._wait_idle(grace)
        with self._cond:
            left = [e for e in self._executors if e.heartbeat is not None]
        released = 0
        if left:
            for executor in left:
                executor.heartbeat.lost.set()  # they stop at their next check
            released = release_leases([(e.run_id, e.owner) for e in left])
            log.warning(
                "drain: %d run(s) still mid-step after %.1fs; leases released", released, grace
            )
        self.drained.set()
        return released

    def _wait_idle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self._cond:
            while self._busy and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(min(remaining, HEARTBEAT_SECONDS))

    def _supervise(self) -> None:
        main = threading.main_thread()
        beat_at, reported = 0.0, -1
        try:
            while main.is_alive() and not _cluster_stopping():
                since = time.monotonic() - beat_at
                if since >= HEARTBEAT_SECONDS or (
                    self._busy != reported and since >= CHANGE_REPORT_SECONDS
                ):
                    reported = self._busy
                    self._beat()
                    beat_at = time.monotonic()
                main.join(STOP_POLL_SECONDS)
            # a SIGTERM of the cluster hands runs over now; a recycle lets them finish first
            urgent = _cluster_stopping()
            self.closing.set()
            if urgent:
                self.drain.set()
            self._beat()
            self.stop(finish_first=not urgent)
        except Exception:
            log.exception("run pool supervisor failed; releasing leases")
            self.stop(grace=0)
        finally:
            try:
                WorkerHeartbeat.objects.filter(worker=self.name).delete()
            except Exception:
                log.warning("could not remove the heartbeat of %s", self.name, exc_info=True)
            connection.close()
            # the runs are handed over: the process's other threads (its loop too) stop with it
            left = process_threads().stop_all(timeout=STOP_POLL_SECONDS)
            if left:
                log.info("threads still running as the process stops: %s", ", ".join(left))

    def _beat(self) -> None:
        """Report this process's runs in flight and capacity (/healthz, /metrics): one
        INSERT ... ON CONFLICT DO UPDATE in autocommit. `update_or_create` was a transaction of
        four statements (BEGIN, SELECT ... FOR UPDATE, UPDATE, COMMIT) and the ORM's model and
        query building for each."""
        try:
            values = {
                "worker": self.name,
                "last_seen_at": timezone.now(),
                "runs_in_flight": self._busy,
                "run_capacity": self.capacity,
                "draining": self.closing.is_set(),
                "db_connections": connections.pool_size(),
                "process_health": process_health.snapshot(),
            }
            with connection.cursor() as cursor:
                cursor.execute(_beat_sql(), _db_values(values))
            weather.database.passed()
        except Exception as exc:
            if is_infrastructure_error(exc):
                weather.database.noticed(exc, "the pool's heartbeat")  # tried again next beat
            else:
                log.warning("pool heartbeat failed", exc_info=True)
        finally:
            connection.close()


BEAT_COLUMNS = (
    "worker",
    "last_seen_at",
    "runs_in_flight",
    "run_capacity",
    "draining",
    "db_connections",
    "process_health",
)


def _beat_sql() -> str:
    """The heartbeat's UPSERT (PostgreSQL and SQLite alike; `last_sweep_at` is the sweeper's)."""
    table = connection.ops.quote_name(WorkerHeartbeat._meta.db_table)
    quoted = [connection.ops.quote_name(column) for column in BEAT_COLUMNS]
    updates = ", ".join(f"{column} = EXCLUDED.{column}" for column in quoted[1:])
    return (
        f"INSERT INTO {table} ({', '.join(quoted)}) VALUES ({', '.join(['%s'] * len(quoted))}) "
        f"ON CONFLICT ({quoted[0]}) DO UPDATE SET {updates}"
    )


def _db_values(values: dict[str, Any]) -> list[Any]:
    """`values` as the backend stores them (the JSON field's adapter, the datetime's form)."""
    meta = WorkerHeartbeat._meta
    return [
        meta.get_field(column).get_db_prep_value(values[column], connection)
        for column in BEAT_COLUMNS
    ]


def handover_wait() -> float:
    """AGENTRUNS_HANDOVER_WAIT_SECONDS, at most a quarter of q2's `timeout` (which would kill
    the process, runs in flight and all, if a task did not return)."""
    timeout = settings.Q_CLUSTER.get("timeout") or 0
    wait = conf.HANDOVER_WAIT_SECONDS
    return min(wait, timeout / 4) if timeout else wait


_pool_of: tuple[int, RunPool] | None = None
_pool_lock = threading.Lock()


def process_pool() -> RunPool:
    """This process's pool (keyed by pid: each forked q2 worker has its own)."""
    global _pool_of
    with _pool_lock:
        if _pool_of is None or _pool_of[0] != os.getpid():
            _pool_of = (os.getpid(), RunPool(conf.RUNS_PER_PROCESS))
        return _pool_of[1]


# ---------------------------------------------------------------- the qcluster process
def expect_cluster_stop() -> None:
    """In `qcluster`, before q2 forks: the flag its stop signal sets for every process."""
    global cluster_stopping
    cluster_stopping = multiprocessing.get_context("fork").RawValue(ctypes.c_bool, False)


def forward_stop_signals(q2_handler: Callable[[int, Any], None]) -> None:
    """SIGTERM/SIGINT of `qcluster`: tell every pool to drain now, then let q2 stop as usual."""

    def on_stop(signum: int, frame: Any) -> None:
        if cluster_stopping is not None:
            cluster_stopping.value = True
        q2_handler(signum, frame)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)


def _cluster_stopping() -> bool:
    return cluster_stopping is not None and bool(cluster_stopping.value)


__all__ = [
    "RunPool",
    "expect_cluster_stop",
    "forward_stop_signals",
    "handover_wait",
    "process_pool",
]
