"""Pydantic AI's OpenAI model as the engine's provider (`AGENTRUNS_MODEL=openai:<name>`, in
process, PostgreSQL), against the fake OpenAI-compatible server on a real socket: streamed text
and tool calls become steps and delta events, usage feeds the run's tokens, a 429 or a 5xx is a
backed-off outage, a 401 fails the run with the reason and no key in any stored text."""

from __future__ import annotations

import json

import pytest

from agentruns.models import AttemptOutcome, RunEvent, StepAttempt
from agentruns.services import start_run
from scripts.fake_openai_server import Fail, FakeOpenAI, Reply
from tests.helpers import advance, event_types, steps
from tests.providers.kit import API_KEY

# transaction=True: the lease keeper (its own thread and connection) must see the run it renews
# while a back-off keeps the executor waiting
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake():
    with FakeOpenAI(mode="error") as server:
        yield server


@pytest.fixture
def pa_openai(settings, fake):
    settings.AGENTRUNS_MODEL = "openai:fake-model"
    settings.OPENAI_BASE_URL = fake.url
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_TIMEOUT_SECONDS = 10
    settings.OPENAI_MAX_RETRIES = 0  # each try one request: the engine's backoff is under test
    settings.AGENTRUNS_MODEL_PRICES = "fake-model=1/2"
    return settings


def test_streamed_text_and_tool_calls_through_pydantic_ais_openai_model(pa_openai, fake):
    fake.script(
        Reply(
            text="Two echoes coming up.",
            tool_calls=[("t_echo", {"text": "first"}), ("t_echo", {"text": "b", "times": 2})],
            chunk_chars=3,
            usage=(40, 12),
        ),
        Reply(text="Both echoed.", usage=(60, 5)),
    )
    run = advance(start_run("script", {"case": "pa"}).run)
    assert run.status == "succeeded" and run.output == "Both echoed.", run.error
    rows = steps(run)
    assert [(s.kind, s.tool) for s in rows] == [
        ("model", ""),
        ("tool", "t_echo"),
        ("tool", "t_echo"),
        ("model", ""),
    ]
    assert rows[0].text == "Two echoes coming up."
    assert rows[2].result == {"echo": "bb"}
    assert (run.prompt_tokens, run.completion_tokens) == (100, 17)
    assert run.cost_usd > 0  # priced by AGENTRUNS_MODEL_PRICES under the model's name
    deltas = RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
    assert "".join(e.data["text"] for e in deltas) == "Two echoes coming up.Both echoed."
    # the second request carries the assistant turn and both results, in call order
    second = fake.chat_requests()[1].body
    assert second["model"] == "fake-model" and second["stream"] is True
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in tool_messages] == [{"echo": "first"}, {"echo": "bb"}]
    assert "t_echo" in [t["function"]["name"] for t in second["tools"]]


@pytest.mark.parametrize(
    "failure", [Fail(429, retry_after=1), Fail(503)], ids=["429 Retry-After", "503"]
)
def test_rate_limits_and_server_errors_are_weather_not_attempts(pa_openai, fake, failure):
    """Before any text, a 429 or 5xx is an outage the run backs off from (model_outage.py),
    honouring Retry-After; the SDK's own retries are off, so each try is one request."""
    fake.script(failure, Reply(text="Back again."))
    run = advance(start_run("script", {"case": "pa"}).run)
    assert run.status == "succeeded" and run.output == "Back again.", run.error
    (step,) = steps(run)
    outcomes = StepAttempt.objects.filter(step=step).order_by("number")
    assert [a.outcome for a in outcomes] == [AttemptOutcome.SUCCEEDED]
    first, second = fake.chat_requests()
    if failure.retry_after:
        assert second.received_at - first.received_at >= 1.0
    types = event_types(run)
    assert "step.retry_scheduled" not in types and "step.failed" not in types


def test_an_auth_error_fails_the_run_with_the_reason(pa_openai, fake):
    fake.script(Fail(401, message=f"Incorrect API key provided: {API_KEY}."))
    run = advance(start_run("script", {"case": "pa"}).run)
    assert run.status == "failed"
    assert "HTTP 401" in run.error
    (step,) = steps(run)
    assert step.status == "failed" and step.attempts == 1
    assert len(fake.chat_requests()) == 1
    assert API_KEY not in run.error and API_KEY not in step.error
    for data in RunEvent.objects.filter(run=run).values_list("data", flat=True):
        assert API_KEY not in json.dumps(data)
