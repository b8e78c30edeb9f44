"""Model names through Pydantic AI: `openai:` and `ollama:` runs against the fake server's real
socket, a 429 past the SDK's retries backed off for its Retry-After, and a provider whose SDK
extra is not installed refused at registration and at start-up with the pip command, never
mid-run (registry/model_names.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from agentruns.models import Run, StepAttempt
from agentruns.registry import Agent, register_agent
from agentruns.registry.model_names import UnusableModel, check_model_name, pydantic_ai_name
from agentruns.services import start_run
from scripts.fake_openai_server import Fail, Reply
from tests.helpers import advance, event_types, steps

ROOT = Path(__file__).resolve().parents[2]
# provider prefix -> (the module its SDK installs, the pydantic-ai-slim extra)
EXTRAS = {
    "anthropic": ("anthropic", "anthropic"),
    "google-gla": ("google.genai", "google"),
    "groq": ("groq", "groq"),
    "mistral": ("mistralai", "mistral"),
    "bedrock": ("boto3", "bedrock"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


MISSING = [prefix for prefix, (module, _) in EXTRAS.items() if not _installed(module)]


def start(run_input: dict | None = None) -> Run:
    return start_run("script", run_input or {"case": "names"}).run


@pytest.mark.django_db
def test_a_pydantic_ai_openai_name_streams_tools_usage_and_cost_through_the_engine(
    openai_settings, fake
):
    openai_settings.AGENTRUNS_MODEL = "openai:fake-model"
    openai_settings.AGENTRUNS_MODEL_PRICES = "fake-model=1000/2000"
    fake.script(
        Reply(
            text="Echoing that back.",
            tool_calls=[("t_echo", {"text": "split into many pieces " * 4})],
            chunk_chars=4,
            usage=(40, 10),
        ),
        Reply(text="Done echoing.", chunk_chars=4, usage=(60, 5)),
    )
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Done echoing."
    assert run.model == "openai:fake-model"
    assert [(s.kind, s.status) for s in steps(run)] == [
        ("model", "succeeded"),
        ("tool", "succeeded"),
        ("model", "succeeded"),
    ]
    assert steps(run)[1].result == {"echo": "split into many pieces " * 4}
    assert (run.prompt_tokens, run.completion_tokens) == (100, 15)
    assert run.cost_usd == Decimal("0.13")  # (100 * 1000 + 15 * 2000) / 1e6
    assert event_types(run).count("model.delta") >= 1
    first, second = fake.chat_requests()
    assert first.body["model"] == "fake-model" and first.body["stream"] is True
    assert second.body["messages"][-1]["role"] == "tool"


@pytest.mark.django_db
def test_a_429_past_the_sdk_retries_waits_its_retry_after_and_is_no_attempt(openai_settings, fake):
    openai_settings.OPENAI_MAX_RETRIES = 0  # the engine's backoff, not the SDK's, must wait
    openai_settings.AGENTRUNS_MODEL_BACKOFF_SECONDS = 0.05
    fake.script(Fail(429, retry_after=1), Reply(text="After the wait."))
    run = advance(start())
    while run.status == "queued":  # the backoff gave the thread back: run it when due
        run = advance(run)
    assert run.status == "succeeded" and run.output == "After the wait."
    (step,) = steps(run)
    assert StepAttempt.objects.filter(step=step).count() == 1
    first, second = fake.chat_requests()
    assert second.received_at - first.received_at >= 1.0  # Retry-After honoured


@pytest.mark.django_db
def test_an_ollama_name_reaches_its_server_through_pydantic_ai(openai_settings, fake, monkeypatch):
    monkeypatch.setenv("OLLAMA_BASE_URL", fake.url)
    openai_settings.AGENTRUNS_MODEL = "ollama:fake-llama"
    fake.script(Reply(text="Hello from a local model.", usage=(7, 5)))
    run = advance(start())
    assert run.status == "succeeded" and run.output == "Hello from a local model."
    assert fake.chat_requests()[0].body["model"] == "fake-llama"
    assert (run.prompt_tokens, run.completion_tokens) == (7, 5)


@pytest.mark.django_db
def test_a_model_that_cannot_be_built_fails_the_run_with_its_reason(openai_settings, monkeypatch):
    monkeypatch.delenv("OLLAMA_BASE_URL", raising=False)
    openai_settings.AGENTRUNS_MODEL = "ollama:llama3.2"
    run = advance(start())
    assert run.status == "failed"
    assert "cannot use model 'ollama:llama3.2'" in run.error and "OLLAMA_BASE_URL" in run.error
    assert run.lease_owner == ""


def test_names_resolve_to_pydantic_ai_names():
    assert pydantic_ai_name("openai/gpt-4o-mini") == "openai:gpt-4o-mini"
    assert pydantic_ai_name("google-gla:gemini-2.5-flash") == "google:gemini-2.5-flash"
    assert pydantic_ai_name("google-vertex:gemini-2.5-pro") == "google-cloud:gemini-2.5-pro"
    assert pydantic_ai_name("anthropic:claude-sonnet-4-5") == "anthropic:claude-sonnet-4-5"
    for usable in ("scripted", "test", "openai/gpt-4o", "openai:gpt-4o", "ollama:llama3.2"):
        check_model_name(usable)


@pytest.mark.parametrize("name", ["gpt-4o", "nonsense:model", "openai:", ":x"])
def test_an_unknown_name_is_refused(name):
    with pytest.raises(UnusableModel, match="model"):
        check_model_name(name)


@pytest.mark.skipif(not MISSING, reason="every provider SDK is installed")
@pytest.mark.parametrize("prefix", MISSING)
def test_a_missing_extra_is_refused_at_registration_naming_the_pip_extra(prefix):
    extra = EXTRAS[prefix][1]
    with pytest.raises(UnusableModel) as info:
        register_agent(
            Agent(f"needs-{extra}", "Be brief.", ["t_echo"], model=f"{prefix}:some-model")
        )
    assert f'pip install "pydantic-ai-slim[{extra}]"' in str(info.value)
    from agentruns.registry import UnknownAgent, get_agent

    with pytest.raises(UnknownAgent):
        get_agent(f"needs-{extra}")  # nothing half registered


@pytest.mark.skipif("anthropic" not in MISSING, reason="the anthropic SDK is installed")
def test_a_missing_extra_stops_a_process_at_start_up():
    env = {**os.environ, "AGENTRUNS_MODEL": "anthropic:claude-sonnet-4-5"}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "AGENTRUNS_MODEL" in done.stderr
    assert 'pip install "pydantic-ai-slim[anthropic]"' in done.stderr
