"""One model request's stream, consumed by ONE task on an event loop, handing text to sync code.

`pydantic_ai.direct.model_request_stream_sync` enters the event loop, a lock, a memory stream
and a fresh task per stream event (~70 µs of CPU per delta, benchmarks/model_path.py). Here one
task opens the stream (`async with`, so its cancel scopes and the client's loop-bound resources
stay in that one task), iterates it, and returns to the synchronous caller only when the caller
has to act: a text delta while the caller's `TextSink` has no `take` (the turn's first delta,
which the executor commits itself), and the end. Once `take` is set, deltas are handed to it
inside the task (the executor's delta feed: a lock and a list append, no database), so a
streamed turn costs two loop entries however many deltas it has.

The task runs on the calling thread's own loop (`thread_loop`) while the caller waits, so the
caller's database work never runs inside a running loop. A thread whose loop is already running
(Playwright's sync API, a notebook) cannot run it there: the task then runs on a loop of its own
in a short-lived thread, handing over the same way (`take` is then called on that thread: it
must be thread-safe, as the delta feed is).

`answer_now` is the unstreamed request of a model that never waits (the scripted model without
delay): its coroutine is run to the end right here when it awaits nothing, with no task and no
loop entry, and only what it does await goes to the thread's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import types
from collections.abc import Callable, Coroutine, Generator
from contextlib import AbstractAsyncContextManager, suppress
from typing import Any, TypeVar

from pydantic_ai.messages import (
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import StreamedResponse

from agentruns.registry.pydantic_agents.calls import run_sync, thread_loop
from agentruns.runtime.providers.base import TextSink

_END = object()
T = TypeVar("T")


class SinkFailed(Exception):
    """The sink's `take` raised (a lost lease, a stopped delta feed): the stream was closed and
    `error` is re-raised as it is, never classified as the model's failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


def _text(event: Any) -> str:
    if isinstance(event, PartDeltaEvent):
        return event.delta.content_delta if isinstance(event.delta, TextPartDelta) else ""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    return ""


class _Pump:
    """The hand-over between the stream's task and the synchronous caller."""

    def __init__(
        self,
        open_stream: Callable[[], AbstractAsyncContextManager[StreamedResponse]],
        sink: TextSink | None,
        threaded: bool,
    ) -> None:
        self.open_stream, self.sink, self.threaded = open_stream, sink, threaded
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        self.resume: asyncio.Future | None = None  # the task waits on it after a hand-over
        self.wake: Any = self._new_wake()  # the caller waits on it: a delta, or _END

    def _new_wake(self) -> Any:
        return concurrent.futures.Future() if self.threaded else self.loop_future()

    def loop_future(self) -> asyncio.Future:
        if self.loop is None:
            self.loop = thread_loop()
        return self.loop.create_future()

    async def consume(self) -> ModelResponse:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        sink = self.sink
        try:
            async with self.open_stream() as stream:
                async for event in stream:
                    delta = _text(event)
                    if not delta:
                        continue
                    take = sink.take if sink is not None else None
                    if take is None:
                        self.resume = self.loop.create_future()
                        self.wake.set_result(delta)
                        await self.resume
                        continue
                    try:
                        take(delta)
                    except Exception as exc:
                        raise SinkFailed(exc) from exc
                return stream.get()
        finally:
            if not self.wake.done():
                self.wake.set_result(_END)

    # ------------------------------------------------------------ the caller's side
    def deltas(self) -> Generator[str, None, ModelResponse]:
        if self.threaded:
            return (yield from self._threaded())
        loop = self.loop or thread_loop()
        task = loop.create_task(self.consume())
        try:
            while (delta := loop.run_until_complete(self.wake)) is not _END:
                yield delta
                self.wake = loop.create_future()
                self.resume.set_result(None)
            return loop.run_until_complete(task)
        finally:
            if not task.done():  # the caller stopped early (its commit failed, a lost lease)
                task.cancel()
                with suppress(BaseException):
                    loop.run_until_complete(task)

    def _threaded(self) -> Generator[str, None, ModelResponse]:
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(asyncio.run(self.consume()))
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)
                if not self.wake.done():
                    self.wake.set_result(_END)

        thread = threading.Thread(target=run, name="agentruns-stream", daemon=True)
        thread.start()
        try:
            while (delta := self.wake.result()) is not _END:
                yield delta
                self.wake = concurrent.futures.Future()
                self.loop.call_soon_threadsafe(self.resume.set_result, None)
            thread.join()
        finally:
            if thread.is_alive():
                with suppress(RuntimeError):  # its loop closed meanwhile
                    self.loop.call_soon_threadsafe(self.task.cancel)
                thread.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]


def stream_deltas(
    open_stream: Callable[[], AbstractAsyncContextManager[StreamedResponse]],
    sink: TextSink | None = None,
) -> Generator[str, None, ModelResponse]:
    """Yield the text deltas `sink` does not take, then return the stream's response."""
    try:
        asyncio.get_running_loop()
        threaded = True
    except RuntimeError:
        threaded = False
    return (yield from _Pump(open_stream, sink, threaded).deltas())


def answer_now(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`'s result, run eagerly on this thread (as the running loop's code, so what asks for
    the loop finds it); a coroutine that awaits something goes on as a task of the loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return run_sync(coro)  # this thread's loop is someone else's: run_sync's own thread
    loop = thread_loop()
    asyncio._set_running_loop(loop)
    try:
        awaited = coro.send(None)
    except StopIteration as done:
        return done.value
    finally:
        asyncio._set_running_loop(None)
    return run_sync(_go_on(coro, awaited))


@types.coroutine
def _go_on(coro: Coroutine[Any, Any, T], awaited: Any) -> Generator[Any, Any, T]:
    """The rest of a coroutine that `answer_now` started, driven by a task (as `yield from`)."""
    while True:
        try:
            sent = yield awaited
        except BaseException as exc:  # a cancellation: into the coroutine, which may handle it
            try:
                awaited = coro.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            awaited = coro.send(sent)
        except StopIteration as done:
            return done.value
