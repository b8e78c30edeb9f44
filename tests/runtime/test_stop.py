"""Stop means stop, in process on PostgreSQL with the real SDK against the fake OpenAI server's
socket: a stop mid-stream ends the model turn within a second, keeping its text so far, and a
stop during a side-effect call lets the call finish (one effect) and ends before the next turn."""

from __future__ import annotations

import threading
import time

import pytest

from agentruns import services
from agentruns.models import Run, RunEvent
from agentruns.runtime.engine.switch import RunExecutor
from agentruns.services import start_run
from scripts.fake_openai_server import FakeOpenAI, Reply
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
    worker = threading.Thread(target=lambda: RunExecutor(run.id).advance(), daemon=True)
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
