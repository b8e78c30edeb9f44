"""The HTTP side of a stream, in process (stream/http_handler.py, stream/access/sse.py): Django's
real ASGI handler and middleware, driven with ASGI messages.

- A request's synchronous parts run on a thread of its own, let go once an async streamed body
  starts: while the body waits, the request holds no thread (Django's own handler keeps it for
  the whole stream).
- A body that fails after its headers went out still ends the response: daphne would otherwise
  hold it half-sent forever and stop reaping applications.
- A process handles WEB_REQUESTS_AT_ONCE requests at once, the others wait their turn (a
  streamed body gives its turn back when it starts); a request whose turn does not come within
  WEB_QUEUE_SECONDS gets a JSON 503 with Retry-After.
- An SSE body whose stream fails ends with an AI SDK `error` chunk: "database unavailable" for
  weather, a plain message for anything else, never the exception's text.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import AsyncToSync, SyncToAsync, markcoroutinefunction
from django.db import OperationalError
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path

from agentruns.stream import http_handler
from agentruns.stream.access.sse import watched_body
from agentruns.stream.http_handler import RequestGate, RequestThread, StreamingASGIHandler
from agentruns.stream.unavailable import REASON

pytestmark = pytest.mark.django_db(transaction=True)

seen: dict[str, object] = {}


def waiting_view(request):
    seen["view_thread"] = threading.current_thread()

    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        seen["waiting"].set()
        await seen["release"].wait()
        yield b"last"

    return StreamingHttpResponse(body(), content_type="text/event-stream")


def failing_view(request):
    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        raise RuntimeError("the body failed")

    return StreamingHttpResponse(body(), content_type="text/event-stream")


def quick_view(request):
    return HttpResponse(b"done")


def blocking_view(request):
    seen["blocking"].set()
    seen["unblock"].wait(30)
    return HttpResponse(b"unblocked")


async def async_view(request):
    return HttpResponse(f"async view, {request.async_marks}".encode())


class AsyncOnlyMiddleware:
    """A host project's middleware that can only be async."""

    sync_capable, async_capable = False, True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request):
        request.async_marks = "marked"
        return await self.get_response(request)


urlpatterns = [
    path("async", async_view),
    path("waits", waiting_view),
    path("fails", failing_view),
    path("quick", quick_view),
    path("blocks", blocking_view),
]


async def call(path_: str, on_message=None) -> list[dict]:
    """One GET through the handler; the messages it sent."""
    sent: list[dict] = []
    asked: list[bool] = []
    never = asyncio.Event()  # the client stays: no http.disconnect

    async def receive() -> dict:
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if on_message is not None:
            await on_message(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path_,
        "raw_path": path_.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    await StreamingASGIHandler()(scope, receive, send)
    return sent


@pytest.fixture
def urls(settings):
    settings.ROOT_URLCONF = __name__
    settings.ALLOWED_HOSTS = ["testserver"]


def test_a_waiting_stream_holds_no_request_thread(urls):
    async def scenario() -> tuple[int, list[dict]]:
        seen["waiting"], seen["release"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(call("/waits"))
        await asyncio.wait_for(seen["waiting"].wait(), timeout=30)
        view_thread = seen["view_thread"]
        for _ in range(100):  # the let-go thread ends as soon as it is idle
            if not view_thread.is_alive():
                break
            await asyncio.sleep(0.02)
        alive = view_thread.is_alive()
        seen["release"].set()
        return alive, await asyncio.wait_for(task, timeout=30)

    alive, sent = asyncio.run(scenario())
    # the view ran on a thread of its own (not the loop's), which was gone while the body waited
    assert seen["view_thread"] is not threading.main_thread()
    assert not alive
    bodies = [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]
    assert b"".join(bodies) == b"firstlast" and sent[-1].get("more_body", False) is False


def test_requests_wait_their_turn_and_a_streamed_body_gives_it_back(urls, settings, monkeypatch):
    settings.WEB_QUEUE_SECONDS = 0.5
    monkeypatch.setattr(http_handler, "_GATE", RequestGate(1))

    def status_and_body(sent: list[dict]) -> tuple[int, bytes]:
        bodies = [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]
        return sent[0]["status"], b"".join(bodies)

    async def scenario() -> dict[str, list[dict]]:
        seen["waiting"], seen["release"] = asyncio.Event(), asyncio.Event()
        seen["blocking"], seen["unblock"] = threading.Event(), threading.Event()
        streaming = asyncio.create_task(call("/waits"))
        await asyncio.wait_for(seen["waiting"].wait(), timeout=30)
        beside_a_stream = await asyncio.wait_for(call("/quick"), timeout=30)
        blocking = asyncio.create_task(call("/blocks"))
        while not seen["blocking"].is_set():
            await asyncio.sleep(0.01)
        turned_away = await asyncio.wait_for(call("/quick"), timeout=30)
        waiting = asyncio.create_task(call("/quick"))
        await asyncio.sleep(0.1)
        seen["unblock"].set()  # the turn passes on to the request waiting for it
        seen["release"].set()
        return {
            "beside_a_stream": beside_a_stream,
            "turned_away": turned_away,
            "waited": await asyncio.wait_for(waiting, timeout=30),
            "blocking": await asyncio.wait_for(blocking, timeout=30),
            "streaming": await asyncio.wait_for(streaming, timeout=30),
        }

    sent = asyncio.run(scenario())
    assert status_and_body(sent["beside_a_stream"]) == (200, b"done")
    assert status_and_body(sent["waited"]) == (200, b"done")
    assert status_and_body(sent["blocking"]) == (200, b"unblocked")
    status, body = status_and_body(sent["turned_away"])
    headers = dict(sent["turned_away"][0]["headers"])
    assert status == 503 and int(headers[b"retry-after"]) >= 1
    assert json.loads(body)["error"].startswith("the server is busy")


def test_a_body_failing_after_its_headers_still_ends_the_response(urls, caplog):
    sent = asyncio.run(call("/fails"))  # no exception leaves the handler
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert sent[-1] == {"type": "http.response.body"}  # the end, after "first"
    assert "the body failed" in caplog.text


def test_request_thread_runs_calls_in_order_and_ends_when_let_go():
    executor = RequestThread()
    names = [executor.submit(lambda: threading.current_thread().name).result() for _ in range(3)]
    assert names == ["asgi-request"] * 3 and executor.alive()
    executor.let_go()
    for _ in range(100):
        if not executor.alive():
            break
        threading.Event().wait(0.02)
    assert not executor.alive()
    assert executor.submit(lambda: 7).result(timeout=10) == 7  # a later call: a thread again
    executor.shutdown()
    assert not executor.alive()
    with pytest.raises(RuntimeError):
        executor.submit(lambda: 1)


async def chunks_of(upstream: AsyncIterator[bytes]) -> list[dict]:
    out = []
    async for frame in watched_body(upstream, viewer=None, slot=None):
        out.append(json.loads(frame.decode().removeprefix("data: ")))
    return out


@pytest.mark.parametrize(
    "failure, said",
    [
        (OperationalError("connection refused"), REASON),
        (KeyError("secret internals"), "the stream failed; resume it to continue"),
    ],
)
def test_an_sse_body_that_fails_ends_with_an_error_chunk(failure, said):
    async def upstream() -> AsyncIterator[bytes]:
        yield b'data: {"type": "start"}\n\n'
        raise failure

    assert asyncio.run(chunks_of(upstream())) == [
        {"type": "start"},
        {"type": "error", "errorText": said},
    ]


def test_a_requests_middleware_and_view_are_entered_on_its_thread_once(urls, monkeypatch):
    """Django built for ASGI keeps every middleware that can be async async, and each of them
    hops to the request's thread and back for its process_request and process_response."""
    hops: list[str] = []
    for adapter in (SyncToAsync, AsyncToSync):
        hop = adapter.__call__

        def counted(self, *args, _hop=hop, **kwargs):
            wrapped = getattr(self, "func", None) or getattr(self, "awaitable", None)
            hops.append(f"{type(self).__name__} {wrapped!r}")
            return _hop(self, *args, **kwargs)

        monkeypatch.setattr(adapter, "__call__", counted)
    sent = asyncio.run(call("/quick"))  # through the project's whole MIDDLEWARE
    assert sent[0]["status"] == 200
    # Django's request_started receivers, the chain with its view, and the response's close()
    assert len(hops) <= 3, "\n".join(hops)


def test_a_host_projects_async_middleware_and_async_view_still_work(urls, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, f"{__name__}.AsyncOnlyMiddleware"]
    sent = asyncio.run(call("/async"))
    bodies = [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]
    assert sent[0]["status"] == 200 and b"".join(bodies) == b"async view, marked"
