"""Fixtures of the page tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _uncached_metrics(settings):
    # a fresh computation per scrape in tests; production caches a few seconds
    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 0
