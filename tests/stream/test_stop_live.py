"""Stop means stop, with real processes: daphne serving the AI SDK chat endpoint, a `qcluster`
worker on PostgreSQL whose model is the fake OpenAI server's real socket, streaming a long
answer slowly (4 characters every 20 ms: ten seconds of text). A chat's stop button (its stop
endpoint) ends the model turn within a second, measured from the stop request to the run's
`cancelled` row and to the end of the chat's own SSE stream; the text streamed so far is the
run's output; a resume of the stream after the stop replays the same chunks and ends.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from django.db import connection

from agentruns.models import Run, RunEvent
from agentruns.tokens import create_token
from scripts.fake_openai_server import FakeOpenAI, Reply
from tests.conftest import make_user
from tests.procs import start_web, start_worker, wait_until
from tests.providers.kit import API_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(300)]

LONG = "word " * 400
CHAT = "stop-live-1"


def sse_chunks(lines) -> list[dict | str]:
    """The UI message stream's chunks as they come (`[DONE]` as the string)."""
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


def test_a_chats_stop_ends_the_model_turn_within_a_second(tmp_path, django_user_model):
    starter = make_user(django_user_model, "starter", ["agentruns.view_run", "agentruns.start_run"])
    headers = {"Authorization": f"Bearer {create_token(starter)}"}
    with FakeOpenAI(mode="error", api_key=API_KEY) as fake:
        fake.script(Reply(text=LONG, chunk_chars=4, delay=0.02))
        env = {
            "AGENTRUNS_AGENT_MODULES": "tests.testkit",
            "AGENTRUNS_MODEL": "openai:fake-model",
            "OPENAI_BASE_URL": fake.url,
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_TIMEOUT_SECONDS": 30,
        }
        web, url = start_web(tmp_path, **env)
        worker = start_worker(tmp_path, **env)
        try:
            request = {
                "id": CHAT,
                "messages": [{"role": "user", "parts": [{"type": "text", "text": "Hello"}]}],
            }
            live: list[dict | str] = []
            asked = stream_ended = None
            ended_row: list[float] = []

            def watch_the_row() -> None:  # the run's `cancelled` row, seen from outside
                try:
                    wait_until(
                        lambda: Run.objects.filter(status="cancelled").exists(),
                        timeout=30,
                        interval=0.01,
                        message="the run's cancelled row",
                    )
                    ended_row.append(time.monotonic())
                finally:
                    connection.close()

            with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                with client.stream("POST", "/api/chat/script", json=request) as response:
                    assert response.status_code == 200, response.read()
                    for chunk in sse_chunks(response.iter_lines()):
                        live.append(chunk)
                        deltas = [
                            c for c in live if isinstance(c, dict) and c["type"] == "text-delta"
                        ]
                        if asked is None and len(deltas) >= 10:
                            watcher = threading.Thread(target=watch_the_row, daemon=True)
                            asked = time.monotonic()
                            watcher.start()
                            stopped = client.post(f"/api/chat/script/{CHAT}/stop", json={})
                            assert stopped.status_code == 200, stopped.text
                        if chunk == "[DONE]":
                            stream_ended = time.monotonic()
                watcher.join(30)
                resumed = client.get(f"/api/chat/script/{CHAT}/stream", params={"startIndex": 0})
        finally:
            worker.stop()
            web.stop()

    run = Run.objects.get()
    assert asked is not None and stream_ended is not None and ended_row, live[-5:]
    to_row, to_stream_end = ended_row[0] - asked, stream_ended - asked
    print(
        f"stop -> cancelled row {to_row * 1000:.0f} ms, -> stream end {to_stream_end * 1000:.0f} ms"
    )
    assert to_row < 1.0, to_row
    assert to_stream_end < 1.0, to_stream_end
    assert (run.status, run.stop_reason) == ("cancelled", "stopped")

    # the text streamed so far is kept: the run's output, the chat's text part, the step's text
    text = "".join(c["delta"] for c in live if isinstance(c, dict) and c["type"] == "text-delta")
    assert 40 <= len(text) < len(LONG) and run.output == text
    assert LONG.startswith(text)
    types = [c["type"] for c in live if isinstance(c, dict)]
    assert types[-4:] == ["text-end", "finish-step", "abort", "finish"] and live[-1] == "[DONE]"
    assert "reset-step" not in types
    finish = live[-2]
    assert finish["finishReason"] == "other"
    assert finish["messageMetadata"]["stopReason"] == "stopped"

    # a resume after the stop replays what was written, the same chunks, and ends
    assert resumed.status_code == 200
    assert list(sse_chunks(resumed.text.splitlines())) == live

    # the model's stream was closed, not read to its end, and no second turn was asked for
    assert len(fake.chat_requests()) == 1
    deltas = RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
    assert "".join(e.data["text"] for e in deltas) == text
