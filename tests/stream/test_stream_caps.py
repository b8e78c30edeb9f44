"""Every kind of stream counts against one cap per user and per process, and an open SSE stream
holds no OS thread while it waits (stream/access/slots.py, stream/http_handler.py), against a
real daphne: 300 concurrent chat requests from one user; sockets and SSE streams mixed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agentruns.models import Run
from agentruns.tokens import create_token
from tests.helpers import make_user
from tests.procs import start_web

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 50  # AGENTRUNS_SOCKETS_PER_USER's default, which the server runs with
CHATTER = ["agentruns.view_run", "agentruns.start_run"]
QUOTAS_OFF_THE_WAY = {  # only the stream caps may refuse here
    "AGENTRUNS_START_BURST": "1000000",
    "AGENTRUNS_START_PER_SECOND": "1000",
    "AGENTRUNS_RUNS_IN_FLIGHT_PER_USER": "1000000",
}


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[tuple[str, int]]:
    """One daphne for the module, the start quotas out of the way (only the stream caps may
    refuse here): its URL and its pid."""
    with django_db_blocker.unblock():
        proc, url = start_web(tmp_path_factory.mktemp("web"), **QUOTAS_OFF_THE_WAY)
    try:
        yield url, proc.popen.pid, proc
    finally:
        proc.kill()


def process_status(pid: int) -> dict[str, float]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {"threads": int(fields["Threads"]), "rss_mb": int(fields["VmRSS"].split()[0]) / 1024}


def chat(chat_id: str) -> dict:
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund please"}]}
    return {"id": chat_id, "messages": [message], "input": {"order_id": "ORD-1001"}}


class Opened(NamedTuple):
    """A started SSE request. `lines` must live as long as the stream is meant to stay open:
    httpx closes the response when its line iterator is collected."""

    status: int
    headers: httpx.Headers
    body: bytes  # a refusal's
    response: httpx.Response | None  # open, when admitted
    lines: AsyncIterator[str] | None


async def open_sse(client: httpx.AsyncClient, method: str, url: str, **kwargs) -> Opened:
    request = client.build_request(method, url, **kwargs)
    response = await client.send(request, stream=True)
    if response.status_code != 200:
        body = await response.aread()
        await response.aclose()
        return Opened(response.status_code, response.headers, body, None, None)
    lines = response.aiter_lines()
    while not (await anext(lines)).startswith("data: {"):  # the stream's first chunk
        pass
    return Opened(200, response.headers, b"", response, lines)


def test_one_users_300_concurrent_chats_get_the_cap_and_429s_and_hold_no_threads(
    web, django_user_model
):
    url, pid, proc = web
    user = make_user(django_user_model, "chatter", CHATTER)
    headers = {"Authorization": f"Bearer {create_token(user)}"}
    idle = process_status(pid)

    async def burst() -> tuple[list, dict[str, float]]:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=60, headers=headers) as client:
            answers = await asyncio.gather(
                *(
                    open_sse(client, "POST", f"{url}/api/chat/refund", json=chat(f"c-{i}"))
                    for i in range(300)
                )
            )
            await asyncio.sleep(1.0)  # every admitted stream open and waiting for its run
            held = process_status(pid)
            for opened in answers:
                if opened.response is not None:
                    await opened.response.aclose()
        return answers, held

    answers, held = asyncio.run(burst())
    statuses = Counter(opened.status for opened in answers)
    print("BODIES", {o.status: o.body[:300] for o in answers if o.status != 200})
    print(json.dumps({"statuses": statuses, "idle": idle, "held": held}))
    assert statuses[200] == CAP and statuses[429] == 300 - CAP, (statuses, proc.log())
    for opened in answers:
        if opened.status == 429:
            assert int(opened.headers["Retry-After"]) >= 1
            assert "streams open" in json.loads(opened.body)["error"]
    # a refused request started nothing: one run per admitted stream
    assert Run.objects.filter(created_by=user).count() == CAP
    # the streams waited in the event loop: not a thread each (the old handler: one per stream)
    assert held["threads"] <= idle["threads"] + 30, (idle, held)

    async def once_more() -> int:
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            for _ in range(50):  # the server notices the closed streams within moments
                opened = await open_sse(
                    client, "POST", f"{url}/api/chat/refund", json=chat("after")
                )
                if opened.response is not None:
                    await opened.response.aclose()
                if opened.status != 429:
                    return opened.status
                await asyncio.sleep(0.2)
        return 429

    assert asyncio.run(once_more()) == 200  # the slots were given back


def test_sockets_and_sse_streams_share_one_cap(web, django_user_model):
    url, *_ = web
    user = make_user(django_user_model, "mixer", CHATTER)
    token = create_token(user)
    headers = {"Authorization": f"Bearer {token}"}
    run = Run.objects.create(agent="script", input={}, status="running")
    ws_url = url.replace("http", "ws") + f"/ws/runs/{run.id}/?after=0"

    async def socket():
        opened = await connect(ws_url, origin=url, additional_headers=headers, open_timeout=30)
        try:
            await opened.send(json.dumps({"type": "ping"}))
            reply = json.loads(await asyncio.wait_for(opened.recv(), timeout=30))
            assert reply["type"] == "pong"
            return opened, None
        except ConnectionClosed as closed:
            return opened, closed.rcvd.code

    async def mixed() -> None:
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            started = await open_sse(client, "POST", f"{url}/api/chat/refund", json=chat("m"))
            assert started.status == 200
            resume = f"{url}/api/chat/refund/m/stream"
            streams = [started]
            for _ in range(CAP // 2 - 1):
                opened = await open_sse(client, "GET", resume)
                assert opened.status == 200, opened.body
                streams.append(opened)
            sockets = []
            for _ in range(CAP - CAP // 2):
                ws, code = await socket()
                assert code is None
                sockets.append(ws)
            # the cap is full: one more of either kind is refused at once
            refused = await open_sse(client, "GET", resume)
            assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1, refused
            extra, code = await socket()
            assert code == 4013
            await extra.close()
            # an SSE stream ends: a socket may take its place
            await streams.pop().response.aclose()
            for _ in range(50):
                ws, code = await socket()
                if code is None:
                    sockets.append(ws)
                    break
                await ws.close()
                await asyncio.sleep(0.2)
            assert code is None
            for ws in sockets:
                await ws.close()
            for opened in streams:
                await opened.response.aclose()

    asyncio.run(mixed())
