"""Django's ASGI handler, with a request's thread let go while its streamed body waits.

Django gives every ASGI request a thread of its own for the request's synchronous parts (the
middleware, a sync view: asgiref's `ThreadSensitiveContext`), and keeps it until the request
ends. For an SSE answer that is the whole life of the stream: 300 open chat streams held 300
idle OS threads (daphne grew from 6 to 306 threads and 47 MB). Here the request's
thread-sensitive calls run on a `RequestThread` instead: the same one call at a time on one
thread while the request is handled, and let go once an async streamed body starts: the thread
returns its database connection and ends as soon as it is idle. Whatever the body still has to
run synchronously later (Django's `response.close()` at the end) gets a short-lived thread of
its own. The bodies themselves wait in the event loop and read the database through the shared
executors (`ui_stream.py`), as the socket consumer does.

A process handles at most WEB_REQUESTS_AT_ONCE requests at once (a `RequestGate`; a streamed
body lets its turn go when it starts), the others wait their turn in the event loop, in order.
Each request holds a pooled database connection while it is handled: 300 requests let in at once
were 300 threads sharing the GIL and ten connections, a request holding its connection for
seconds while others waited out WEB_DB_POOL_TIMEOUT and answered 503 "the database is
unavailable" although it was up. A request whose turn does not come within WEB_QUEUE_SECONDS
gets 503 with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

from agentruns.conf import conf
from agentruns.runtime.threads import process_threads

log = logging.getLogger(__name__)

BUSY_RETRY_AFTER_SECONDS = 2


class RequestThread(Executor):
    """An executor of one call at a time on one thread, which can be let go: after `let_go()`
    (and `shutdown()`) its thread ends whenever no call waits, and a later call starts another."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future, Callable, tuple, dict] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._waiting = 0  # calls submitted and not yet taken
        self._thread: threading.Thread | None = None
        self._held = True
        self._closed = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._waiting += 1
            self._calls.put((future, fn, args, kwargs))
            if self._thread is None:
                # (the process's thread owner starts it; `_work` waits for this lock first)
                self._thread = process_threads().start("asgi-request", self._work)
        return future

    def let_go(self) -> None:
        """From now on the thread ends whenever it is idle."""
        with self._lock:
            self._held = False
        self._calls.put(None)  # wakes an idle thread to end

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            self._held = False
            thread = self._thread
        self._calls.put(None)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def alive(self) -> bool:
        with self._lock:
            return self._thread is not None

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._waiting == 0 and not self._held:
                        self._thread = None
                        return
                item = self._calls.get()
                if item is None:
                    continue  # woken to look again
                with self._lock:
                    self._waiting -= 1
                future, fn, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to the caller, as ThreadPoolExecutor does
                    future.set_exception(exc)
        finally:
            # this thread's database connections (pooled: back to the pool) end with it
            connections.close_all()


class RequestGate:
    """At most `size` requests of the process handled at once, the others waiting in order; one
    semaphore per event loop (daphne has one; a test may run several in turn)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._by_loop = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._by_loop.get(loop)
        if semaphore is None:
            semaphore = self._by_loop[loop] = asyncio.Semaphore(self.size)
        return semaphore

    async def enter(self, patience: float) -> Turn | None:
        """A turn, or None when none came within `patience` seconds."""
        semaphore = self._semaphore()
        try:
            await asyncio.wait_for(semaphore.acquire(), patience)
        except TimeoutError:
            return None
        return Turn(semaphore)


@dataclass(eq=False)
class Turn:
    """A request's turn at the gate, given back once (when its streamed body starts, or when it
    ends)."""

    semaphore: asyncio.Semaphore
    given_back: bool = False

    def give_back(self) -> None:
        if not self.given_back:
            self.given_back = True
            self.semaphore.release()


@dataclass(eq=False)
class _Handling:
    thread: RequestThread
    turn: Turn


_CURRENT: ContextVar[_Handling | None] = ContextVar("agentruns_request_handling", default=None)
_GATE: RequestGate | None = None


def request_gate() -> RequestGate:
    global _GATE
    if _GATE is None:
        _GATE = RequestGate(conf.WEB_REQUESTS_AT_ONCE)
    return _GATE


async def _answer_busy(send: Any) -> None:
    body = json.dumps(
        {
            "error": f"the server is busy; try again in {BUSY_RETRY_AFTER_SECONDS} seconds",
            "retry_after": BUSY_RETRY_AFTER_SECONDS,
        }
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(BUSY_RETRY_AFTER_SECONDS).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class StreamingASGIHandler(ASGIHandler):
    """`django.core.asgi.get_asgi_application()`'s handler, on a RequestThread per request,
    behind the process's RequestGate, its middleware and view entered once per request."""

    def load_middleware(self, is_async: bool = False) -> None:
        """The chain built synchronous whatever `is_async` asks (ASGIHandler asks async), as
        under WSGI, and entered once on the request's thread. Built for ASGI, Django keeps each
        middleware that can be async async, so every one of them (`MiddlewareMixin`) hops to
        the request's thread and back for its `process_request` and its `process_response`,
        and a sync-only one in between hops back to the loop: about eight thread hand-overs a
        request, a third of daphne's CPU in a batch of runs. An async-only middleware or an
        async view of a host project still works (Django adapts it with `async_to_sync`);
        streamed bodies are still sent from the loop (`send_response`)."""
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)  # Django's own refusal
            return
        turn = await request_gate().enter(conf.WEB_QUEUE_SECONDS)
        if turn is None:
            log.warning(
                "%s %s waited its turn too long: answering 503", scope["method"], scope["path"]
            )
            await _answer_busy(send)
            return
        thread = RequestThread()
        token = _CURRENT.set(_Handling(thread, turn))
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            _CURRENT.reset(token)
            turn.give_back()
            thread.shutdown(wait=False)  # its thread ends once its last call has returned

    async def send_response(self, response: Any, send: Any) -> None:
        if response.streaming and getattr(response, "is_async", False):
            handling = _CURRENT.get()
            if handling is not None:
                handling.thread.let_go()
                handling.turn.give_back()
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await super().send_response(response, tracked)
        except Exception:
            if not started:
                raise
            # A body that fails after its headers went out cannot become a 500. Raised to
            # daphne, the response stays half-sent forever, and daphne's application checker
            # (which tries to send that 500) fails and stops reaping every later request.
            log.exception("a streamed response failed after its headers; ending it")
            try:
                await send({"type": "http.response.body"})
            except Exception:  # the client is gone as well
                pass
