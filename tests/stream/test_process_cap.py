"""The per-process stream cap (AGENTRUNS_SOCKETS_PER_PROCESS, stream/access/slots.py) refuses
every kind of stream once other users' streams fill it: a chat POST and a resume GET with a 429
and `Retry-After` (starting nothing), a run socket with 4013; a slot given back lets the next one
in. In process: the API through Django's test client, the socket through the real ASGI stack."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from agentruns.models import Run
from agentruns.stream.access.slots import SLOTS, TRY_LATER, Slot
from config.asgi import application
from tests.helpers import ApiClient, make_user

from .kit import make_run

pytestmark = pytest.mark.django_db(transaction=True)

CAP = 3
CHAT = {
    "id": "cap-1",
    "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund"}]}],
    "input": {"order_id": "ORD-1001"},
}


@pytest.fixture
def others_fill_the_process() -> Iterator[list[Slot]]:
    """CAP streams of other users held in this process, which fill it (the process cap set to
    what it holds now plus CAP), and no per-user cap in the way."""
    process_cap = SLOTS.total + CAP
    with override_settings(AGENTRUNS_SOCKETS_PER_PROCESS=process_cap, AGENTRUNS_SOCKETS_PER_USER=0):
        held = [SLOTS.take(f"someone-else-{i}") for i in range(CAP)]
        try:
            yield held
        finally:
            for slot in held:
                slot.release()


def socket_close_code(run: Run, token: str) -> int | None:
    async def connect() -> int | None:
        comm = WebsocketCommunicator(
            application,
            f"/ws/runs/{run.id}/?after=0",
            headers=[
                (b"origin", b"http://testserver"),
                (b"host", b"testserver"),
                (b"authorization", f"Bearer {token}".encode()),
            ],
        )
        connected, _ = await comm.connect(timeout=20)
        assert connected  # accepted first, so the refusal carries its code
        message = await comm.receive_output(timeout=20)
        await comm.disconnect()
        return message.get("code") if message["type"] == "websocket.close" else None

    return async_to_sync(connect)()


def test_a_full_process_refuses_every_kind_of_stream(django_user_model, others_fill_the_process):
    full = SLOTS.total
    chatter = ApiClient(
        make_user(django_user_model, "chatter", ["agentruns.view_run", "agentruns.start_run"])
    )
    posted = chatter.post("/api/chat/refund", CHAT)
    resumed = chatter.get("/api/chat/refund/cap-1/stream")
    for refused in (posted, resumed):
        assert refused.status_code == 429, refused  # (a stream on the old code)
        assert int(refused["Retry-After"]) >= 1
        assert "as many streams as it may" in json.loads(refused.content)["error"]
    assert not Run.objects.exists()  # the refused chat started nothing
    assert socket_close_code(make_run(), chatter.token) == TRY_LATER
    assert SLOTS.total == full  # a refusal holds nothing

    others_fill_the_process.pop().release()
    # a slot is free: the resume is admitted (no run for this chat yet: 204) and, not being a
    # stream, gives its slot straight back
    assert chatter.get("/api/chat/refund/cap-1/stream").status_code == 204
    assert SLOTS.total == full - 1
