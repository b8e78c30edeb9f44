"""Runs driven by the OpenAI provider through the engine (in process, PostgreSQL, the real SDK
against the fake server): tool calls, bad arguments, retries, auth failures, interrupted
streams, the rebuilt conversation, token and cost budgets."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from agentruns.models import AttemptOutcome, Run, RunEvent, StepAttempt
from agentruns.services import start_run
from scripts.fake_openai_server import Fail, Reply
from tests.helpers import advance, event_types, steps
from tests.providers.kit import API_KEY

pytestmark = pytest.mark.django_db


def start(agent: str = "script", run_input: dict | None = None) -> Run:
    return start_run(agent, run_input or {"case": "openai"}).run


def bodies(fake) -> list[dict]:
    return [r.body for r in fake.chat_requests()]


def test_parallel_tool_calls_with_split_arguments(openai_settings, fake):
    fake.script(
        Reply(
            text="Two echoes coming up.",
            tool_calls=[("t_echo", {"text": "first"}), ("t_echo", {"text": "second", "times": 2})],
            chunk_chars=2,
            usage=(40, 12),
        ),
        Reply(text="Both echoed.", usage=(60, 5)),
    )
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Both echoed."
    rows = steps(run)
    assert [(s.kind, s.tool, s.status) for s in rows] == [
        ("model", "", "succeeded"),
        ("tool", "t_echo", "succeeded"),
        ("tool", "t_echo", "succeeded"),
        ("model", "", "succeeded"),
    ]
    assert rows[1].arguments == {"text": "first"} and rows[1].result == {"echo": "first"}
    assert rows[2].arguments == {"text": "second", "times": 2} and rows[2].result == {
        "echo": "secondsecond"
    }
    assert (rows[0].prompt_tokens, rows[0].completion_tokens) == (40, 12)
    assert (run.prompt_tokens, run.completion_tokens) == (100, 17)

    # the second request carries the assistant turn and both results, in call order
    second = bodies(fake)[1]["messages"]
    assert second[2]["role"] == "assistant" and second[2]["content"] == "Two echoes coming up."
    assert [c["id"] for c in second[2]["tool_calls"]] == ["call_2_0", "call_2_1"]
    assert [(m["role"], m["tool_call_id"], json.loads(m["content"])) for m in second[3:]] == [
        ("tool", "call_2_0", {"echo": "first"}),
        ("tool", "call_2_1", {"echo": "secondsecond"}),
    ]
    deltas = RunEvent.objects.filter(run=run, type="model.delta", data__step=0)
    assert "".join(e.data["text"] for e in deltas.order_by("seq")) == "Two echoes coming up."


def test_malformed_arguments_are_fed_back_and_the_model_recovers(openai_settings, fake):
    fake.script(
        Reply(text="Echoing.", tool_calls=[("t_echo", '{"text": "hi"')]),  # cut-off JSON
        Reply(text="Again.", tool_calls=[("t_echo", {"text": 5})]),  # fails the schema
        Reply(text="Third time.", tool_calls=[("t_echo", {"text": "hi"})]),
        Reply(text="Fixed it."),
    )
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Fixed it."
    rows = steps(run)
    assert [(s.kind, s.status) for s in rows] == [
        ("model", "succeeded"),
        ("tool", "failed"),
        ("model", "succeeded"),
        ("tool", "failed"),
        ("model", "succeeded"),
        ("tool", "succeeded"),
        ("model", "succeeded"),
    ]
    assert "not valid JSON" in rows[1].error
    assert rows[3].error and "text" in rows[3].error
    # what the model saw on its next turn: the error as the tool's result
    requests = bodies(fake)
    assert len(requests) == 4
    seen_json_error = json.loads(requests[1]["messages"][-1]["content"])
    assert requests[1]["messages"][-1]["tool_call_id"] == "call_2_0"
    assert "not valid JSON" in seen_json_error["error"]
    assert json.loads(requests[2]["messages"][-1]["content"])["error"] == rows[3].error
    assert json.loads(requests[3]["messages"][-1]["content"]) == {"echo": "hi"}


def test_rate_limit_then_success_is_one_attempt(openai_settings, fake):
    fake.script(Fail(429, retry_after=1), Reply(text="Sorry for the wait."))
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Sorry for the wait."
    (step,) = steps(run)
    assert step.attempts == 1  # retried by the SDK inside the attempt
    first, second = fake.chat_requests()
    assert second.received_at - first.received_at >= 1.0  # Retry-After honoured
    assert "step.retry_scheduled" not in event_types(run)


def test_server_errors_beyond_sdk_retries_are_weather_not_an_attempt(openai_settings, fake):
    """A 500 before any text is an outage the run backs off from (runtime/outages/model_outage.py):
    the step's only attempt is the one that answered."""
    openai_settings.OPENAI_MAX_RETRIES = 0
    fake.script(Fail(500), Reply(text="Back again."))
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Back again."
    (step,) = steps(run)
    assert step.attempts == 1
    outcomes = list(
        StepAttempt.objects.filter(step=step).order_by("number").values_list("outcome", flat=True)
    )
    assert outcomes == [AttemptOutcome.SUCCEEDED]
    assert len(fake.chat_requests()) == 2
    types = event_types(run)
    assert "step.retry_scheduled" not in types and "step.failed" not in types
    assert "model.superseded" not in types  # nothing had streamed, nothing to supersede


def test_auth_error_fails_the_run_cleanly(openai_settings, fake):
    fake.script(Fail(401, message=f"Incorrect API key provided: {API_KEY}."))
    run = advance(start())
    assert run.status == "failed"
    assert run.error.startswith("model error: authentication failed (HTTP 401)")
    assert "OPENAI_API_KEY" in run.error
    (step,) = steps(run)
    assert step.status == "failed" and step.attempts == 1
    assert len(fake.chat_requests()) == 1  # never retried
    assert run.lease_owner == ""
    # the key is in no stored text a person could see
    assert API_KEY not in run.error and API_KEY not in step.error
    for data in RunEvent.objects.filter(run=run).values_list("data", flat=True):
        assert API_KEY not in json.dumps(data)


def test_interrupted_stream_is_superseded_and_the_conversation_is_the_same(openai_settings, fake):
    """An uninterrupted run and one whose first stream breaks mid-way (after a delta batch was
    persisted) send exactly the same requests; the dead attempt's text is superseded."""
    openai_settings.AGENTRUNS_DELTA_FLUSH_MS = 0  # persist every delta
    turns = [
        dict(text="Checking that for you.", tool_calls=[("t_echo", {"text": "hi"})], chunk_chars=4),
        dict(text="All done: hi."),
    ]
    fake.script(*(Reply(**t) for t in turns))
    clean = advance(start(run_input={"case": "same"}))
    clean_bodies = bodies(fake)
    fake.clear()

    fake.script(Reply(**turns[0], drop_after=3), *(Reply(**t) for t in turns))
    resumed = advance(start(run_input={"case": "same"}))
    resumed_bodies = bodies(fake)

    assert clean.status == resumed.status == "succeeded"
    assert clean.output == resumed.output == "All done: hi."
    assert len(resumed_bodies) == 3
    assert resumed_bodies[0] == resumed_bodies[1]  # the new attempt re-sent the same request
    assert resumed_bodies[1:] == clean_bodies  # and the run went on exactly as the clean one

    first = steps(resumed)[0]
    assert first.attempts == 2 and first.text == "Checking that for you."
    superseded = RunEvent.objects.get(run=resumed, type="model.superseded")
    assert superseded.data == {"step": 0, "attempt": 1}
    dead = RunEvent.objects.filter(run=resumed, type="model.delta", data__step=0, data__attempt=1)
    assert dead.exists() and superseded.seq > max(e.seq for e in dead)
    live = RunEvent.objects.filter(run=resumed, type="model.delta", data__step=0, data__attempt=2)
    assert "".join(e.data["text"] for e in live.order_by("seq")) == "Checking that for you."


def test_token_budget_stops_the_run(openai_settings, fake):
    fake.script(Reply(text="Echo.", tool_calls=[("t_echo", {"text": "x"})], usage=(50, 20)))
    run = advance(start("script-budget"))  # token_budget=60
    assert run.status == "failed" and run.stop_reason == "token_budget"
    assert run.error == "token budget exhausted (70 of 60)"
    assert len(fake.chat_requests()) == 1


def test_cost_table_and_cost_budget_stop_the_run(openai_settings, fake):
    openai_settings.AGENTRUNS_MODEL_PRICES = "other=1/1, fake-model=1000/2000"
    openai_settings.AGENTRUNS_MAX_COST_USD = 0.1
    turn = dict(text="Echo.", tool_calls=[("t_echo", {"text": "x"})], usage=(50, 20))
    fake.script(Reply(**turn), Reply(**turn), Reply(**turn))
    run = advance(start())
    # 50 * 1000/1e6 + 20 * 2000/1e6 = 0.09 per turn: the second turn crosses 0.10
    assert run.cost_usd == Decimal("0.18")
    assert run.status == "failed" and run.stop_reason == "cost_budget"
    assert run.error == "cost budget exhausted ($0.180000 of $0.1)"
    assert len(fake.chat_requests()) == 2


def test_agent_model_overrides_the_setting(openai_settings, fake):
    openai_settings.AGENTRUNS_MODEL = "scripted"
    fake.script(Reply(text="Pinned."))
    run = advance(start("openai-pinned"))
    assert run.model == "openai/pinned-model"
    assert run.status == "succeeded" and run.output == "Pinned."
    assert fake.chat_requests()[0].body["model"] == "pinned-model"
