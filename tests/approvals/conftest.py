"""Fixtures of the approval tests (their agents, tools and run builders: tests/approvals/kit.py)."""

from __future__ import annotations

import pytest

from . import kit


@pytest.fixture(autouse=True)
def _reset_kit():
    kit.reset()
    yield
    kit.reset()
