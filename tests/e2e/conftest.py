"""Fixtures of the browser tests: a real headless Chromium (Debian's, never a downloaded one)."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import sync_playwright

# Debian's chromium, never a downloaded browser; these flags keep it off the (closed) network
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser():
    """A real headless Chromium driven by Playwright's sync API."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
