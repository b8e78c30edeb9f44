"""Stop means stop, in process on PostgreSQL with the real SDK against the fake OpenAI server's
socket: a stop mid-stream ends the model turn within a second, keeping its text so far, and a
stop during a side-effect call lets the call finish (one effect) and ends before the next turn."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from agentruns import services
from agentruns.models import Run, RunEvent
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.services import start_run
from agentruns.stream.ui_chunks import chunks_of
from scripts.fake_openai_server import FakeOpenAI, Reply
from tests import testkit
from tests.helpers import steps
from tests.procs import wait_until
from tests.providers.kit import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "word " * 400  # 2000 characters: at 4 a chunk, 20 ms apart, ten seconds of streaming


@pytest.fixture
def fake():
    with FakeOpenAI(mode="error") as server:
        yield server


@pytest.fixture
def pa_openai(settings, fake):
    settings.AGENTRUNS_MODEL = "openai:fake-model"
    settings.OPENAI_BASE_URL = fake.url
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_TIMEOUT_SECONDS = 30
    settings.OPENAI_MAX_RETRIES = 0
    return settings


def _execute(run: Run) -> threading.Thread:
    """Execute the run on a thread of its own, as a pool's run thread does."""

    def work() -> None:
        try:
            RunExecutor(run.id).advance()
        finally:
            connection.close()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    return worker


def _streamed(run: Run) -> str:
    deltas = RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
    return "".join(e.data["text"] for e in deltas)


def test_a_stop_mid_stream_ends_the_turn_within_a_second_keeping_its_text(pa_openai, fake):
    fake.script(Reply(text=LONG, chunk_chars=4, delay=0.02))
    run = start_run("script", {"case": "stop"}).run
    worker = _execute(run)
    wait_until(lambda: len(_streamed(run)) > 40, timeout=20, message="text streaming")
    asked = time.monotonic()
    services.stop_run(run.id)
    ended = wait_until(
        lambda: Run.objects.filter(id=run.id, status="cancelled").first(),
        timeout=20,
        interval=0.01,
        message="the run to end",
    )
    took = time.monotonic() - asked
    worker.join(10)
    assert took < 1.0, took
    assert ended.stop_reason == "stopped"
    text = _streamed(run)
    assert 40 < len(text) < len(LONG)
    assert ended.output == text  # the partial answer is the run's output
    (model,) = steps(run)
    assert model.status == "succeeded" and model.text == text and model.tool_calls == []
    status = RunEvent.objects.filter(run=run, type="run.status").order_by("-seq").first()
    assert status.data["stop_reason"] == "stopped"
    # the AI SDK stream keeps the text part and ends with an abort, then its finish
    events = RunEvent.objects.filter(run=run).order_by("seq")
    chunks = chunks_of(run.id, [(e.seq, e.type, e.data) for e in events])
    assert [c["type"] for c in chunks[-4:]] == ["text-end", "finish-step", "abort", "finish"]
    assert "reset-step" not in [c["type"] for c in chunks]
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == text
    # the model's stream was closed: it got no second request, and stopped sending
    assert len(fake.chat_requests()) == 1


def test_a_stop_during_a_side_effect_call_lets_it_finish_once_and_asks_the_model_no_more(
    pa_openai, fake
):
    """The call is never torn in half: it finishes (one effect, recorded as done) and the run
    ends before the next model turn, with the stop's reason."""
    entered, release = threading.Event(), threading.Event()
    testkit.HOOKS["t_email"] = lambda name, ctx: (entered.set(), release.wait(10))
    fake.script(
        Reply(text="Sending it.", tool_calls=[("t_email", {"to": "a@example.com"})]),
        Reply(text="Sent, anything else?"),  # never asked for
    )
    run = start_run("script", {"case": "stop"}).run
    worker = _execute(run)
    assert entered.wait(20), "the call never began"
    services.stop_run(run.id)
    time.sleep(0.3)  # the stop has long reached the worker: the call still runs
    assert worker.is_alive()
    release.set()
    worker.join(20)
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "stopped")
    assert len(testkit.CALLS["t_email"]) == 1
    model, call = steps(run)
    assert (model.status, call.tool, call.status) == ("succeeded", "t_email", "succeeded")
    assert call.result == {"sent": "a@example.com"}
    assert len(fake.chat_requests()) == 1
