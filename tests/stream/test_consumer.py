"""The socket consumer through the real ASGI stack (origin check, session/bearer auth, routing).

Each test drives `config.asgi.application` with Channels' WebsocketCommunicator, against the
real PostgreSQL test database (transaction=True: the consumer reads from its own connection).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from agentruns.tokens import create_token
from config.asgi import application
from tests.helpers import ApiClient, make_user

from .kit import add_events, add_events_without_nudge, deltas, make_run

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")  # the exact origin check compares the two
db = database_sync_to_async


def communicator(
    run_id, after: int | None = None, headers: list | None = None
) -> WebsocketCommunicator:
    path = f"/ws/runs/{run_id}/" + (f"?after={after}" if after is not None else "")
    return WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, *(headers or [])])


def session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def bearer(user) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {create_token(user)}".encode())


async def receive_frames(comm: WebsocketCommunicator, n: int, timeout: float = 20) -> list[dict]:
    return [json.loads(await comm.receive_from(timeout=timeout)) for _ in range(n)]


async def expect_close(comm: WebsocketCommunicator) -> dict:
    connected, _ = await comm.connect(timeout=20)
    assert connected  # accepted first so the refusal carries a code and a reason
    message = await comm.receive_output(timeout=20)
    assert message["type"] == "websocket.close"
    await comm.wait()
    return message


def test_refused_without_credentials():
    run = make_run()

    async def body():
        return await expect_close(communicator(run.id))

    closed = async_to_sync(body)()
    assert closed["code"] == 4401
    assert "login" in closed["reason"]


def test_refused_with_a_bad_bearer_token():
    run = make_run()

    async def body():
        return await expect_close(
            communicator(run.id, headers=[(b"authorization", b"Bearer art_nope")])
        )

    closed = async_to_sync(body)()
    assert (closed["code"], closed["reason"]) == (4401, "invalid token")


def test_refused_without_view_permission(django_user_model):
    run = make_run()
    outsider = make_user(django_user_model, "outsider")
    cookie = session_cookie(outsider)

    async def body():
        return await expect_close(communicator(run.id, headers=[cookie]))

    closed = async_to_sync(body)()
    assert closed["code"] == 4403
    assert "agentruns.view_run" in closed["reason"]


def test_unknown_run_and_bad_after_are_refused(viewer):
    import uuid

    cookie = session_cookie(viewer)
    run = make_run()

    async def body():
        missing = await expect_close(communicator(uuid.uuid4(), headers=[cookie]))
        bad = await expect_close(
            WebsocketCommunicator(
                application, f"/ws/runs/{run.id}/?after=abc", headers=[ORIGIN, HOST, cookie]
            )
        )
        return missing, bad

    missing, bad = async_to_sync(body)()
    assert missing["code"] == 4404
    assert bad["code"] == 4400


def test_foreign_origin_is_rejected_at_the_handshake(viewer):
    run = make_run()
    cookie = session_cookie(viewer)

    async def body():
        comm = WebsocketCommunicator(
            application,
            f"/ws/runs/{run.id}/",
            headers=[(b"origin", b"http://evil.example"), HOST, cookie],
        )
        connected, _ = await comm.connect(timeout=20)
        return connected

    assert async_to_sync(body)() is False


def test_replay_from_after_matches_the_events_api(viewer):
    run = make_run()
    add_events(
        run.id, [("step.started", {"step": 0, "kind": "model", "status": "running", "attempts": 1})]
    )
    add_events(run.id, deltas(0, ["Hello ", "there, ", "world."]))
    add_events(
        run.id,
        [
            ("step.succeeded", {"step": 0, "kind": "model", "status": "succeeded", "attempts": 1}),
            ("run.status", {"status": "succeeded", "error": "", "stop_reason": ""}),
        ],
    )
    token_header = bearer(viewer)

    async def body():
        comm = communicator(run.id, after=2, headers=[token_header])
        connected, _ = await comm.connect(timeout=20)
        assert connected
        frames = await receive_frames(comm, 4)
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()
        return frames

    frames = async_to_sync(body)()
    assert [f["seq"] for f in frames] == [3, 4, 5, 6]
    assert all(set(f) >= {"seq", "type", "data", "html"} for f in frames)
    assert frames[0]["html"] is None and frames[0]["data"]["text"] == "there, "
    assert 'data-seq="5"' in frames[2]["html"] and "succeeded" in frames[3]["html"]
    # the API is the same log: identical frames minus the html
    api_events = ApiClient(viewer).get(f"/api/runs/{run.id}/events?after=2").json()["events"]
    assert api_events == [{k: v for k, v in f.items() if k != "html"} for f in frames]


def test_tail_delivers_new_events_by_nudge(viewer, settings):
    settings.AGENTRUNS_STREAM_POLL_SECONDS = 120  # far longer than the wait below: nudges only
    run = make_run()
    add_events(run.id, deltas(0, ["old"]))
    cookie = session_cookie(viewer)

    async def body():
        comm = communicator(run.id, after=1, headers=[cookie])
        connected, _ = await comm.connect(timeout=20)
        assert connected
        assert await comm.receive_nothing(timeout=0.3)
        await db(add_events)(run.id, deltas(0, ["new ", "text"]))
        frames = await receive_frames(comm, 2, timeout=30)
        await db(add_events)(run.id, [("run.status", {"status": "succeeded"})])
        frames += await receive_frames(comm, 1, timeout=30)
        await comm.disconnect()
        return frames

    frames = async_to_sync(body)()
    assert [f["seq"] for f in frames] == [2, 3, 4]
    assert [f["data"].get("text") for f in frames[:2]] == ["new ", "text"]


def test_dropped_nudge_is_covered_by_the_poll(viewer, settings):
    settings.AGENTRUNS_STREAM_POLL_SECONDS = 0.2
    run = make_run()
    cookie = session_cookie(viewer)

    async def body():
        comm = communicator(run.id, headers=[cookie])
        connected, _ = await comm.connect(timeout=20)
        assert connected
        assert await comm.receive_nothing(timeout=0.3)
        await db(add_events_without_nudge)(run.id, deltas(0, ["never ", "nudged"]))
        frames = await receive_frames(comm, 2, timeout=30)
        await comm.disconnect()
        return frames

    frames = async_to_sync(body)()
    assert [(f["seq"], f["data"]["text"]) for f in frames] == [(1, "never "), (2, "nudged")]


def test_viewers_share_a_feed_and_a_late_viewer_replays(viewer, settings):
    """Two viewers in one process: one tails, one joins later from after=0; both get everything."""
    settings.AGENTRUNS_STREAM_POLL_SECONDS = 0.2
    run = make_run()
    cookie = session_cookie(viewer)

    async def body():
        first = communicator(run.id, headers=[cookie])
        assert (await first.connect(timeout=20))[0]
        await db(add_events)(run.id, deltas(0, ["a", "b", "c"]))
        got_first = await receive_frames(first, 3)
        second = communicator(run.id, after=0, headers=[cookie])
        assert (await second.connect(timeout=20))[0]
        got_second = await receive_frames(second, 3)
        await db(add_events_without_nudge)(run.id, deltas(0, ["d"]))
        got_first += await receive_frames(first, 1)
        got_second += await receive_frames(second, 1)
        await first.disconnect()
        await second.disconnect()
        return got_first, got_second

    got_first, got_second = async_to_sync(body)()
    assert got_first == got_second
    assert [f["seq"] for f in got_first] == [1, 2, 3, 4]


def test_superseded_attempt_text_is_dropped_by_page_and_stream_alike(viewer, settings):
    from .kit import expected_text, text_from_frames

    run = make_run()
    add_events(run.id, deltas(0, ["partial "]))
    add_events(run.id, [("model.superseded", {"step": 0, "attempt": 1})])
    add_events(run.id, deltas(0, ["whole ", "answer"], attempt=2))
    add_events(run.id, deltas(1, ["lost "]))  # a retried attempt without a superseded event
    add_events(run.id, deltas(1, ["kept"], attempt=2))
    cookie = session_cookie(viewer)

    async def body():
        comm = communicator(run.id, headers=[cookie])
        assert (await comm.connect(timeout=20))[0]
        frames = await receive_frames(comm, 6)
        await comm.disconnect()
        return frames

    frames = async_to_sync(body)()
    assert text_from_frames(frames) == expected_text(run.id) == "whole answerkept"
    page = Client()
    page.force_login(viewer)
    html = page.get(f"/runs/{run.id}/").content.decode()
    assert "partial" not in html and "lost" not in html and "whole answer" in html


def test_stream_survives_an_unreachable_redis_by_polling(viewer, settings):
    """REDIS_URL set but Redis down: the subscription fails, the poll still delivers everything."""
    from tests.procs import free_port

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},
        }
    }
    settings.AGENTRUNS_STREAM_POLL_SECONDS = 0.2
    run = make_run()
    add_events_without_nudge(run.id, deltas(0, ["before "]))
    cookie = session_cookie(viewer)

    async def body():
        comm = communicator(run.id, headers=[cookie])
        assert (await comm.connect(timeout=30))[0]
        frames = await receive_frames(comm, 1, timeout=30)
        await db(add_events_without_nudge)(run.id, deltas(0, ["after"]))
        frames += await receive_frames(comm, 1, timeout=30)
        await comm.disconnect(timeout=30)
        return frames

    frames = async_to_sync(body)()
    assert [f["data"]["text"] for f in frames] == ["before ", "after"]


def test_a_feed_with_only_watchers_renders_nothing_and_a_later_socket_gets_everything(
    viewer, settings, monkeypatch
):
    """The AI SDK stream watches a feed for wakeups only: while no socket views the run, the
    feed renders no frame; it still wakes its watchers (nudged or not), and a socket joining
    later replays every event."""
    import asyncio

    from agentruns.stream import consumer

    settings.AGENTRUNS_STREAM_POLL_SECONDS = 0.2
    run = make_run()
    cookie = session_cookie(viewer)
    rendered: list[int] = []
    real = consumer.encoded_frames_after

    def counting(run_id, after, limit):
        frames = real(run_id, after, limit)
        rendered.extend(seq for seq, _ in frames)
        return frames

    monkeypatch.setattr(consumer, "encoded_frames_after", counting)

    async def body():
        feed = await consumer.open_feed(str(run.id))
        wakeup = asyncio.Event()
        feed.watchers.add(wakeup)
        try:
            await db(add_events)(run.id, deltas(0, ["a", "b"]))
            await asyncio.wait_for(wakeup.wait(), timeout=20)
            while feed.head < 2:
                wakeup.clear()
                await asyncio.wait_for(wakeup.wait(), timeout=20)
            wakeup.clear()
            await db(add_events_without_nudge)(run.id, deltas(0, ["c"]))
            await asyncio.wait_for(wakeup.wait(), timeout=20)
            assert feed.head == 3 and rendered == []
            socket = communicator(run.id, after=0, headers=[cookie])
            assert (await socket.connect(timeout=20))[0]
            got = await receive_frames(socket, 3)
            await db(add_events_without_nudge)(run.id, deltas(0, ["d"]))
            got += await receive_frames(socket, 1)
            await socket.disconnect()
            return got
        finally:
            feed.watchers.discard(wakeup)
            await consumer.close_feed_if_idle(str(run.id), feed)

    frames = async_to_sync(body)()
    assert [f["seq"] for f in frames] == [1, 2, 3, 4]
    assert 4 in rendered  # with a socket viewing, the feed renders again
