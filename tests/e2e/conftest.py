"""Fixtures of the browser tests: a real headless Chromium (Debian's, never a downloaded one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.db import connections
from playwright.sync_api import Browser, sync_playwright

from tests import binaries
from tests.e2e.kit import set_browser_password

# Debian's chromium (or CHROMIUM_PATH), never a downloaded browser; these flags keep it off the
# (closed) network
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium_browser() -> Iterator[Browser]:
    """A real headless Chromium driven by Playwright's sync API.

    Inside the block an event loop runs on this thread, so Django keeps this thread's database
    connections in a context variable of the thread's main context (asgiref's thread-critical
    Local), apart from the ones the test's sync code and pytest-django see. Left open, such a
    connection stays checked out of the pool for the rest of the process, and every later
    `asyncio.run()` on this thread inherits it: a test that took the database away meanwhile
    left it terminated, and a test that advanced a run from a running loop failed with
    "terminating connection due to administrator command" (tests/e2e/test_browser_connections.py).
    So they are given back before the loop ends."""
    executable = binaries.require("chromium", "the browser tests")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            connections.close_all()  # the connections of the loop's context (see above)
            chromium.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium_browser() as chromium:
        yield chromium


@pytest.fixture
def people(seeded, settings, django_user_model) -> Iterator[dict]:
    """seed_demo's users, by username, with the password the browser signs in with."""
    users = {u.username: u for u in django_user_model.objects.all()}
    for user in users.values():
        set_browser_password(user, settings)
    yield users
    connections.close_all()  # the browser's loop ran on this thread (`chromium_browser`)
