"""Fixtures for the run-operations suite (users by permission, script runs, an executor)."""

from __future__ import annotations

import pytest

from agentruns.models import Run
from agentruns.services import start_run
from tests.conftest import make_user
from tests.helpers import advance  # noqa: F401  (the ops tests import it from here)

from . import opskit


@pytest.fixture(autouse=True)
def _reset_opskit(settings):
    opskit.reset()
    # a fresh computation per scrape in tests; production caches a few seconds
    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 0
    yield
    opskit.reset()


@pytest.fixture
def operator(db, django_user_model):
    """May look and operate runs, nothing else (no superuser shortcut)."""
    return make_user(django_user_model, "operator", ["agentruns.view_run", "agentruns.operate_run"])


def script_run(turns: list[dict], agent: str = "ops-script", **run_input) -> Run:
    return start_run(agent, {"script": turns, **run_input}).run
