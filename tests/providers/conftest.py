"""Fixtures for the OpenAI-compatible provider tests: a fake server on a real socket."""

from __future__ import annotations

import pytest

from scripts.fake_openai_server import FakeOpenAI

from .kit import API_KEY, MODEL


@pytest.fixture
def fake():
    """A fake Chat Completions server that answers only what a test scripts (else 400)."""
    with FakeOpenAI(mode="error") as server:
        yield server


@pytest.fixture
def openai_settings(settings, fake):
    """The in-process engine talks to `fake` through the real SDK."""
    settings.AGENTRUNS_MODEL = MODEL
    settings.OPENAI_BASE_URL = fake.url
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_TIMEOUT_SECONDS = 10
    settings.OPENAI_MAX_RETRIES = 2
    settings.OPENAI_REQUEST_OPTIONS = ""
    settings.AGENTRUNS_MODEL_PRICES = ""
    settings.AGENTRUNS_MAX_COST_USD = 0
    return settings
