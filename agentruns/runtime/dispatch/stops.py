"""Stop means stop: a cancel reaches the model turn in flight within a second, not at the next
step boundary.

A cancel (or a stop) sets the run's `cancel_requested` and, on PostgreSQL, sends
`NOTIFY agentruns_stops, '<run id>'` in the same transaction (`announce`: delivered on commit).
Every process that executes model turns listens on that one channel (`StopListener`, a thread
with a LISTEN connection of its own, started when q2 spawns the process) and hands
each payload to `deliver`: when this process has that run's model request in flight, the request
is cancelled on the loop it runs on (its HTTP stream is closed by the cancellation), and the
model unit records the text streamed so far as the turn's partial answer and ends the run.

Why one broadcast channel and not a channel per process or the lease keeper polling the flag:
stops are rare (a person presses a button) while model turns are many, so a payload every
process ignores unless it holds the run costs nothing, needs no mapping from a lease owner to a
process, and is never sent to the wrong one after a lease moved; a poll of the flag would cost a
statement per process every half second while any turn streams, for an event that almost never
comes. Two other readers close the gaps a NOTIFY leaves (a listener reconnecting, SQLite): every
delta flush already reads the flag with its commit and delivers it here, and the listener reads
the flags of this process's turns in flight once each time it (re)connects.

`deliver` never cancels anything but the registered request: the cancel runs on the request's
own loop, and only while the request is still registered there (`stoppable`), so a stop that
arrives as the turn ends cannot reach the code after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from django.db import connection, transaction

from agentruns.models import Run
from agentruns.runtime.dispatch import connections
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread

log = logging.getLogger(__name__)

CHANNEL = "agentruns_stops"
LISTEN_TIMEOUT_SECONDS = 1.0  # how often the listener looks at its `stopped` flag


class TurnStopped(Exception):
    """The model request was cancelled by a stop: not the model's failure, never retried."""


@dataclass(eq=False)
class _Turn:
    """A model request in flight: the task to cancel and the loop it runs on."""

    loop: asyncio.AbstractEventLoop
    task: asyncio.Task
    active: bool = True  # changed on `loop`'s thread only
    stopped: bool = False

    def cancel(self) -> None:
        """On the turn's loop: cancel the request while it is still the registered one."""
        if self.active and not self.stopped:
            self.stopped = True
            self.task.cancel(msg="stopped")


_turns: dict[uuid.UUID, _Turn] = {}
_lock = threading.Lock()


@asynccontextmanager
async def stoppable(run_id: uuid.UUID | None) -> AsyncIterator[None]:
    """The model request inside may be stopped by `deliver(run_id)`: its cancellation comes out
    of this block as `TurnStopped`. No run (a model asked outside a run): nothing to stop."""
    task = asyncio.current_task()
    if run_id is None or task is None:  # (a coroutine run eagerly, outside a task: never waits)
        yield
        return
    turn = _Turn(asyncio.get_running_loop(), task)
    with _lock:
        _turns[run_id] = turn
    try:
        yield
    except (asyncio.CancelledError, Exception) as exc:
        # after a stop, whatever the cancellation became on its way out (a client library may
        # wrap it as a connection error) is the stop, never an outage to retry; before one it is
        # somebody else's (the slice ending, the process stopping) or the model's failure
        if not turn.stopped:
            raise
        if task.cancelling():  # our cancel is spent: the task goes on as one never cancelled
            task.uncancel()
        raise TurnStopped(f"stopped on request ({type(exc).__name__})") from None
    finally:
        turn.active = False
        with _lock:
            if _turns.get(run_id) is turn:
                del _turns[run_id]
    if turn.stopped and task.cancelling():  # it ended on its own as the cancel came
        task.uncancel()


def deliver(run_id: uuid.UUID | str) -> bool:
    """A stop for `run_id` arrived: cancel its model request if this process has one in flight
    (from any thread). Returns whether it had one."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return False
    with _lock:
        turn = _turns.get(key)
    if turn is None:
        return False
    try:
        turn.loop.call_soon_threadsafe(turn.cancel)
    except RuntimeError:  # its loop closed: the turn is over
        return False
    return True


def in_flight() -> list[uuid.UUID]:
    with _lock:
        return list(_turns)


def announce(run_id: uuid.UUID | str) -> None:
    """In the caller's transaction: tell every worker process that `run_id` should stop
    (PostgreSQL; delivered when the transaction commits), and this process too (a run executed
    in process). Elsewhere the model text's commits read the flag."""
    transaction.on_commit(lambda: deliver(run_id))
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(run_id)])


# ------------------------------------------------------------------ the listener
class StopListener(OwnedThread):
    name = "stop-listener"

    def __init__(self) -> None:
        super().__init__()
        self.conn = None
        self.delivered = 0  # stops that reached a turn in flight here (tests, logs)

    def run(self) -> None:
        backoff = weather.Backoff(base=0.1, cap=1.0)
        while not self.stopped.is_set():
            try:
                if self.conn is None:
                    self.conn = connections.open_listener(CHANNEL)
                    self._catch_up()  # stops sent while nobody here listened
                for note in self.conn.notifies(timeout=LISTEN_TIMEOUT_SECONDS):
                    self.delivered += deliver(note.payload)
                backoff.reset()
            except Exception as exc:
                self._drop()
                if is_infrastructure_error(exc):
                    weather.database.noticed(exc, "the stop listener")
                else:
                    log.warning("stop listener failed; listening again", exc_info=True)
                self.stopped.wait(backoff.next())
        self._drop()

    def _catch_up(self) -> None:
        turns = in_flight()
        if not turns:
            return
        try:
            flagged = Run.objects.filter(id__in=turns, cancel_requested=True)
            for run_id in flagged.values_list("id", flat=True):
                self.delivered += deliver(run_id)
        finally:
            connection.close()

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        connections.close_listener(conn)


_listener: tuple[int, StopListener] | None = None
_listener_lock = threading.Lock()


def start_listener(**_: object) -> StopListener | None:
    """When q2 spawns a worker process (its `post_spawn` signal): this process's listener
    (PostgreSQL only; per pid). One more connection per worker process, idle but for stops."""
    global _listener
    if connection.vendor != "postgresql":
        return None
    with _listener_lock:
        if _listener is None or _listener[0] != os.getpid() or _listener[1].stopped.is_set():
            started = StopListener()
            started.start()
            _listener = (os.getpid(), started)
        return _listener[1]
