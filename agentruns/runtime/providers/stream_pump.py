"""Model streams: every streamed model request of the process runs as a task on ONE event loop.

The model unit's body (engine/model/request.py: `Model.request_stream` under pydantic-ai's durable
unit deadline) runs as a task of the process's stream loop (`run_streaming`), and returns to the
synchronous caller only when the caller has to act: a text delta while the caller's `TextSink`
has no `take` (the turn's first delta, which the model unit commits itself), and the end. Once
`take` is set, deltas are handed to it inside the task (the delta feed: a lock and a list
append, no database), so a streamed turn costs two hand-overs however many deltas it has.

The tasks of every run of the process share one loop on a thread of its own (`stream_loop`,
per pid: q2 forks workers). Each run thread used to drive its stream on its own loop: with 200
runs streaming 50 tokens a second that was 10,000 thread wake-ups a second, each taking the
interpreter lock from the others (py-spy: a third of the worker's lock-holding samples were
threads coming back from `select`). On one loop the tokens due at a moment are one wake of one
thread, and the run threads sleep on a lock until a hand-over. The caller's own database work
never runs inside a running loop, and a caller whose thread runs a loop of its own (Playwright's
sync API, a notebook) waits the same way. `take` is called on the stream loop's thread: it must
be thread-safe (the delta feed is). The caller's context variables go with its task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import FIRST_COMPLETED
from contextlib import suppress
from typing import Any, TypeVar

from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

from agentruns.runtime.providers.base import TextSink
from agentruns.runtime.threads import process_threads

_END = object()
T = TypeVar("T")
STREAM_THREAD = "agentruns-streams"


class SinkFailed(Exception):
    """The sink's `take` raised (a lost lease, a stopped delta feed): the stream was closed and
    `error` is re-raised as it is, never classified as the model's failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


_stream_loop: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_stream_loop_lock = threading.Lock()


def stream_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The process's model-stream loop and its thread (started on first use, per pid)."""
    global _stream_loop
    with _stream_loop_lock:
        if _stream_loop is None or _stream_loop[0] != os.getpid() or not _stream_loop[2].is_alive():
            loop = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(loop)  # thread_loop() there: this loop (clients key on it)
                loop.run_forever()

            thread = process_threads().start(
                STREAM_THREAD, run, stop=lambda: loop.call_soon_threadsafe(loop.stop)
            )
            _stream_loop = (os.getpid(), loop, thread)
        return _stream_loop[1], _stream_loop[2]


def _text(event: Any) -> str:
    if isinstance(event, PartDeltaEvent):
        return event.delta.content_delta if isinstance(event.delta, TextPartDelta) else ""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    return ""


class _Pump:
    """A model unit's body as a task of the stream loop, and the hand-over between that task
    and the synchronous caller: the body hands each text delta over with `deliver_delta` (to the
    sink's `take`, or back to the caller)."""

    def __init__(self, body: Callable[[], Coroutine[Any, Any, Any]], sink: TextSink) -> None:
        self.body, self.sink = body, sink
        self.task: asyncio.Task | None = None
        self.resume: asyncio.Future | None = None  # the task waits on it after a hand-over
        # the caller waits on it: a delta, or _END
        self.wake: concurrent.futures.Future = concurrent.futures.Future()

    async def consume(self) -> Any:
        _delivering.set(self)  # this task's own context: the unit's code finds it
        try:
            return await self.body()
        finally:
            if not self.wake.done():
                self.wake.set_result(_END)

    async def deliver(self, delta: str) -> None:
        take = self.sink.take
        if take is None:
            self.resume = asyncio.get_running_loop().create_future()
            self.wake.set_result(delta)
            await self.resume
            return
        try:
            take(delta)
        except Exception as exc:
            raise SinkFailed(exc) from exc

    # ------------------------------------------------------------ the caller's side
    def deltas(self) -> Generator[str, None, Any]:
        loop, thread = stream_loop()
        if threading.current_thread() is thread:
            raise RuntimeError("a model stream cannot be waited for on the stream loop itself")
        context = contextvars.copy_context()
        outcome = concurrent.futures.Future()

        def start() -> None:
            self.task = loop.create_task(self.consume(), context=context)
            self.task.add_done_callback(lambda done: _settle(outcome, done))

        loop.call_soon_threadsafe(start)
        try:
            while True:
                # the task may also end without a hand-over (cancelled by a stop while it
                # waited for us to resume it): then `outcome` is what there is to wait for
                concurrent.futures.wait((self.wake, outcome), return_when=FIRST_COMPLETED)
                if not self.wake.done() or (delta := self.wake.result()) is _END:
                    return outcome.result()
                yield delta
                self.wake = concurrent.futures.Future()
                loop.call_soon_threadsafe(self._resume)
        finally:
            if not outcome.done():  # the caller stopped early (its commit failed, a lost lease)
                loop.call_soon_threadsafe(self._cancel)
                with suppress(BaseException):
                    outcome.result()

    def _resume(self) -> None:
        if self.resume is not None and not self.resume.done():  # (not cancelled meanwhile)
            self.resume.set_result(None)

    def _cancel(self) -> None:
        if self.task is not None:  # it is: `start` was handed to the loop first
            self.task.cancel()


def _settle(outcome: concurrent.futures.Future, task: asyncio.Task) -> None:
    """The task's end, for the caller's thread (once the task is done: nothing left running)."""
    if task.cancelled():
        outcome.set_exception(asyncio.CancelledError())
    elif task.exception() is not None:
        outcome.set_exception(task.exception())
    else:
        outcome.set_result(task.result())


_delivering: contextvars.ContextVar[_Pump | None] = contextvars.ContextVar(
    "agentruns_delivering", default=None
)


async def deliver_delta(text: str) -> bool:
    """Inside a unit run by `run_streaming`: hand `text` over (False: no unit takes deltas)."""
    pump = _delivering.get()
    if pump is None:
        return False
    await pump.deliver(text)
    return True


def run_streaming(
    body: Callable[[], Coroutine[Any, Any, T]], sink: TextSink
) -> Generator[str, None, T]:
    """Run `body()` as a task of the stream loop; yield the text deltas it delivers that `sink`
    does not take, then return what it returns (raise what it raises)."""
    return (yield from _Pump(body, sink).deltas())
