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
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextvars import ContextVar
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

log = logging.getLogger(__name__)

_CURRENT: ContextVar[RequestThread | None] = ContextVar("agentruns_request_thread", default=None)


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
                self._thread = threading.Thread(target=self._work, name="asgi-request", daemon=True)
                self._thread.start()
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


class StreamingASGIHandler(ASGIHandler):
    """`django.core.asgi.get_asgi_application()`'s handler, on a RequestThread per request."""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)  # Django's own refusal
            return
        thread = RequestThread()
        token = _CURRENT.set(thread)
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            _CURRENT.reset(token)
            thread.shutdown(wait=False)  # its thread ends once its last call has returned

    async def send_response(self, response: Any, send: Any) -> None:
        if response.streaming and getattr(response, "is_async", False):
            thread = _CURRENT.get()
            if thread is not None:
                thread.let_go()
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
