"""Where a slice's blocking work runs: its database lane.

The agent's loop of every run a worker process executes is a task on the process's one event
loop (`workers/pool.py`), so nothing blocking may run on that loop. Everything that does (the
ORM, the one writer, a sync tool, a sync instructions function or validator) goes to the slice's
lane instead: `await lane.run(fn, ...)` runs `fn` off the loop, in the caller's context
(context variables such as the slice in progress travel with it), and resumes the task with its
result or exception.

- `ThreadLane` (a worker process, `worker_lane()`): the process's database threads, a few of
  them shared by every run of the process, each keeping its pooled connection while work waits
  for it and giving it back when there is none; and its tool threads for sync functions (a `def`
  tool waiting on an HTTP call holds a tool thread, not a database thread or a connection). So
  the process's threads, connections and interpreter-lock hand-overs are bounded by those
  threads, not by the runs in flight.
- `CallerLane` (a run advanced in the calling thread: `execute_inline`, scripts, tests): the
  caller's own thread is the lane: it serves the slice's blocking work while the slice's loop
  runs on a helper thread, so that work uses the caller's connection and transaction.

`held()` keeps one thread for a block whose work must share a connection across awaits: a
transactional tool's writes and the commit of its result are one transaction. `submit` is the
`concurrent.futures.Executor` face Pydantic AI's sync functions are handed to
(`LaneExecutor`, installed with `Agent.using_thread_executor`).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from agentruns.runtime.dispatch import connections
from agentruns.runtime.threads import process_threads

T = TypeVar("T")
_STOP = object()


def _settle(done: asyncio.Future, ok: bool, value: Any) -> None:
    """On the loop: the lane's answer, unless the awaiting task was cancelled meanwhile."""
    if done.cancelled():
        return
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)


class _Job:
    """One piece of blocking work and where its outcome goes (an asyncio future on `loop`, or a
    concurrent future)."""

    __slots__ = ("context", "fn", "args", "kwargs", "loop", "future", "concurrent")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future | None = None,
        concurrent: Future | None = None,
    ) -> None:
        self.context = contextvars.copy_context()
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.loop, self.future, self.concurrent = loop, future, concurrent

    def __call__(self) -> None:
        try:
            value = self.context.run(self.fn, *self.args, **self.kwargs)
            ok = True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as it is
            value, ok = exc, False
        if self.concurrent is not None:
            if self.concurrent.cancelled():  # (its awaiter gave up; the work is done all the same)
                return
            if ok:
                self.concurrent.set_result(value)
            else:
                self.concurrent.set_exception(value)
            return
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, ok, value)
        except RuntimeError:  # the loop closed under it: nobody awaits this any more
            pass


class Lane:
    """A slice's lane (see the module)."""

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        raise NotImplementedError

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        yield


class WorkerThreads:
    """Threads of a worker process taking blocking jobs from one queue. `keep_connection`: a
    thread keeps its pooled database connection while more work waits (the database threads:
    their jobs are database work); otherwise it gives it back after every job (the tool threads:
    theirs mostly wait on the world)."""

    def __init__(self, name: str, size: int, *, keep_connection: bool) -> None:
        self.size, self.keep_connection = size, keep_connection
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threads = process_threads()
        for number in range(size):
            threads.start(f"{name}-{number}", self._serve, stop=lambda: self.jobs.put(_STOP))

    def put(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def _serve(self) -> None:
        jobs, keep = self.jobs, self.keep_connection
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            job()
            if not keep or jobs.empty():  # nothing waits for this thread: its connection goes
                connections.release()


class ThreadLane(Lane):
    """A worker's slice: its database work on the process's database threads, its sync
    functions on the process's tool threads."""

    def __init__(self, database: WorkerThreads, tools: WorkerThreads) -> None:
        self.database, self.tools = database, tools
        self._held: queue.SimpleQueue[Any] | None = None

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        (self._held or self.database).put(_Job(fn, args, kwargs, loop=loop, future=done))
        return await done

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        done: Future = Future()
        (self._held or self.tools).put(_Job(fn, args, kwargs, concurrent=done))
        return done

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        if self._held is not None:  # (already holding one: the same thread)
            yield
            return
        own: queue.SimpleQueue[Any] = queue.SimpleQueue()
        loop = asyncio.get_running_loop()
        serving = loop.create_future()
        self.database.put(_Job(_serve_held, (own,), {}, loop=loop, future=serving))
        self._held = own
        try:
            yield
        finally:
            self._held = None
            own.put(_STOP)
            await asyncio.shield(serving)


def _serve_held(own: queue.SimpleQueue) -> None:
    """One database thread serves one slice's jobs until it lets go (`ThreadLane.held`)."""
    while (job := own.get()) is not _STOP:
        job()


class CallerLane(Lane):
    """A slice advanced in the calling thread: that thread serves its blocking work (`serve`)
    while the slice's loop runs on a helper thread."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.current_thread()

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if threading.current_thread() is self.thread:  # (already on the lane)
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.jobs.put(_Job(fn, args, kwargs, loop=loop, future=done))
        return await done

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        done: Future = Future()
        self.jobs.put(_Job(fn, args, kwargs, concurrent=done))
        return done

    def serve(self, until: Future) -> None:
        """On the calling thread: run the slice's jobs until `until` is done."""
        until.add_done_callback(lambda _: self.jobs.put(_STOP))
        while (job := self.jobs.get()) is not _STOP:
            job()


class LaneExecutor(Executor):
    """Pydantic AI's executor for sync functions (a `def` tool, a sync instructions function
    or validator): each runs on the lane of the slice that calls it; outside a slice (an agent
    run by hand) on a thread of its own, as Pydantic AI would."""

    def __init__(self, current_lane: Callable[[], Lane | None]) -> None:
        self.current_lane = current_lane

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        lane = self.current_lane()
        if lane is not None:
            return lane.submit(fn, *args, **kwargs)
        done: Future = Future()
        job = _Job(fn, args, kwargs, concurrent=done)
        process_threads().start("agentruns-call", job)
        return done


_threads: tuple[int, ThreadLane] | None = None
_threads_lock = threading.Lock()


def worker_lane() -> ThreadLane:
    """The lane of every slice this worker process runs (its threads started on first use, per
    pid: q2 forks its workers). A lane holds per-slice state only while a transactional tool
    keeps a thread (`held`), so each slice gets its own `ThreadLane` over the same threads."""
    global _threads
    with _threads_lock:
        if _threads is None or _threads[0] != os.getpid():
            from agentruns.conf import conf

            _threads = (
                os.getpid(),
                ThreadLane(
                    WorkerThreads("db", conf.DB_THREADS, keep_connection=True),
                    WorkerThreads("tools", conf.TOOL_THREADS, keep_connection=False),
                ),
            )
        shared = _threads[1]
    return ThreadLane(shared.database, shared.tools)


def blocking(lane: Lane | None, fn: Callable[..., T], /, *args: Any) -> T:
    """`fn(*args)` from synchronous code of a slice: at once when this thread is no event loop's
    (a sync tool runs on the lane already); from an async tool on the loop, on the lane, the
    loop waiting for it (only a tool's own waits do this, once per wait)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args)
    if lane is None:
        raise RuntimeError("blocking work on an event loop outside a run's slice")
    return lane.submit(fn, *args).result()


# ---------------------------------------------------------------- the process's event loop
PROCESS_LOOP_THREAD = "agentruns-runs"
_process_loop: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_process_loop_lock = threading.Lock()


def process_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The process's one event loop for the agent loops of its runs, on a thread of its own
    (started on first use, per pid: q2 forks its workers). Model streams, MCP sessions and
    HTTP clients of every run of the process live on it."""
    global _process_loop
    with _process_loop_lock:
        if (
            _process_loop is None
            or _process_loop[0] != os.getpid()
            or not _process_loop[2].is_alive()
        ):
            loop = asyncio.new_event_loop()

            def serve() -> None:
                asyncio.set_event_loop(loop)  # (clients kept per loop find this one)
                loop.run_forever()

            thread = process_threads().start(
                PROCESS_LOOP_THREAD, serve, stop=lambda: loop.call_soon_threadsafe(loop.stop)
            )
            _process_loop = (os.getpid(), loop, thread)
        return _process_loop[1], _process_loop[2]


def run_on_process_loop(coroutine: Any) -> Future:
    """Schedule `coroutine` as a task of the process's loop (from any other thread)."""
    loop, thread = process_loop()
    if threading.current_thread() is thread:
        coroutine.close()
        raise RuntimeError("a run cannot be advanced synchronously from the process's run loop")
    return asyncio.run_coroutine_threadsafe(coroutine, loop)
