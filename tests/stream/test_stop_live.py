"""Stop means stop, with real processes: daphne serving the AI SDK chat endpoint, a `qcluster`
worker on PostgreSQL whose model is the fake OpenAI server's real socket. A chat's stop button
(its stop endpoint) ends the model turn within a second, measured from the stop request to the
run's `cancelled` row and to the end of the chat's own SSE stream; the text streamed so far is
the run's output; a resume of the stream after the stop replays the same chunks and ends.

Two models: one streaming a long answer steadily (4 characters every 20 ms: ten seconds of
text), where the worker's delta commits could also carry the stop, and one that stalls between
its chunks (5 s), where only the NOTIFY to the worker's stop listener can.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from django.db import connection

from agentruns.models import Run, RunEvent, ThreadMessage
from agentruns.tokens import create_token
from scripts.fake_openai_server import FakeOpenAI, Reply
from tests.conftest import make_user
from tests.procs import wait_until
from tests.providers.kit import API_KEY
from tests.stream.kit import served_by_fake_openai

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(300)]

LONG = "word " * 400
STALLING = "Let me think. " * 20  # 14 characters every 5 s


def sse_chunks(lines) -> list[dict | str]:
    """The UI message stream's chunks as they come (`[DONE]` as the string)."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


@dataclass
class Stopped:
    chat: str
    live: list = field(default_factory=list)  # the chunks the chat's own stream sent
    to_row: float = 0.0  # seconds from the stop request to the run's `cancelled` row
    to_stream_end: float = 0.0  # ... to the chat stream's `[DONE]`
    resumed: list = field(default_factory=list)  # a resume from chunk 0 after the stop

    @property
    def text(self) -> str:
        return "".join(
            c["delta"] for c in self.live if isinstance(c, dict) and c["type"] == "text-delta"
        )

    @property
    def run(self) -> Run:
        return Run.objects.get(thread_turn__thread_id=self.chat)


def chat_and_stop(client: httpx.Client, chat: str, after_deltas: int) -> Stopped:
    """Start a chat, press its stop once `after_deltas` text deltas are in, read to the end."""
    out = Stopped(chat)
    request = {
        "id": chat,
        "messages": [{"role": "user", "parts": [{"type": "text", "text": "Hello"}]}],
    }
    asked = ended = None
    row: list[float] = []

    def watch_the_row() -> None:  # the run's `cancelled` row, seen from outside
        try:
            wait_until(
                lambda: Run.objects.filter(thread_turn__thread_id=chat, status="cancelled"),
                timeout=30,
                interval=0.01,
                message="the run's cancelled row",
            )
            row.append(time.monotonic())
        finally:
            connection.close()

    watcher = threading.Thread(target=watch_the_row, daemon=True)
    with client.stream("POST", "/api/chat/script", json=request) as response:
        assert response.status_code == 200, response.read()
        for chunk in sse_chunks(response.iter_lines()):
            out.live.append(chunk)
            if (
                asked is None
                and out.text
                and len([c for c in out.live if isinstance(c, dict) and c["type"] == "text-delta"])
                >= after_deltas
            ):
                asked = time.monotonic()
                watcher.start()
                stopped = client.post(f"/api/chat/script/{chat}/stop", json={})
                assert stopped.status_code == 200, stopped.text
            if chunk == "[DONE]":
                ended = time.monotonic()
    watcher.join(30)
    assert asked is not None and ended is not None and row, out.live[-5:]
    out.to_row, out.to_stream_end = row[0] - asked, ended - asked
    resumed = client.get(f"/api/chat/script/{chat}/stream", params={"startIndex": 0})
    assert resumed.status_code == 200
    out.resumed = list(sse_chunks(resumed.text.splitlines()))
    return out


def test_a_chats_stop_ends_the_model_turn_within_a_second(tmp_path, django_user_model):
    starter = make_user(django_user_model, "starter", ["agentruns.view_run", "agentruns.start_run"])
    headers = {"Authorization": f"Bearer {create_token(starter)}"}
    with (
        FakeOpenAI(mode="error", api_key=API_KEY) as fake,
        served_by_fake_openai(tmp_path, fake.url) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as client,
    ):
        fake.script(Reply(text=LONG, chunk_chars=4, delay=0.02))
        steady = chat_and_stop(client, "stop-steady", after_deltas=10)
        fake.script(Reply(text=STALLING, chunk_chars=14, delay=5))
        stalled = chat_and_stop(client, "stop-stalled", after_deltas=1)

    for stop, whole in ((steady, LONG), (stalled, STALLING)):
        print(
            f"{stop.chat}: stop -> cancelled row {stop.to_row * 1000:.0f} ms, "
            f"-> stream end {stop.to_stream_end * 1000:.0f} ms"
        )
        assert stop.to_row < 1.0, (stop.chat, stop.to_row)
        assert stop.to_stream_end < 1.0, (stop.chat, stop.to_stream_end)
        run = stop.run
        assert (run.status, run.stop_reason) == ("cancelled", "stopped")

        # the text streamed so far is kept: the run's output, the chat's text part, the events
        assert stop.text and len(stop.text) < len(whole) and whole.startswith(stop.text)
        assert run.output == stop.text
        # the server's usage never came (the stream was cut): the budgets count an estimate
        cut = run.steps.get(kind="model")
        assert cut.prompt_tokens > 0 and cut.completion_tokens > 0
        assert run.prompt_tokens == cut.prompt_tokens
        deltas = RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
        assert "".join(e.data["text"] for e in deltas) == stop.text
        types = [c["type"] for c in stop.live if isinstance(c, dict)]
        assert types[-4:] == ["text-end", "finish-step", "abort", "finish"]
        assert stop.live[-1] == "[DONE]" and "reset-step" not in types
        finish = stop.live[-2]
        assert finish["finishReason"] == "other"
        assert finish["messageMetadata"]["stopReason"] == "stopped"

        # a resume after the stop replays what was written, the same chunks, and ends
        assert stop.resumed == stop.live

        # the chat's history keeps what was said before the stop: the next turn's model reads it
        said = [m.message for m in ThreadMessage.objects.filter(thread_id=stop.chat)]
        responses = [m for m in said if m["kind"] == "response"]
        assert [[p["content"] for p in m["parts"]] for m in responses] == [[stop.text]]

    assert len(steady.text) >= 40
    assert stalled.text == STALLING[:14]  # its first chunk: the next was 5 s away
    # each stopped stream was closed, not read to its end, and no second turn was asked for
    assert len(fake.chat_requests()) == 2
