"""Fixtures of the crash tests (their helpers: tests/crash/kit.py)."""

from __future__ import annotations

import pytest

from tests.crash.kit import MEASURED, lease_settings


@pytest.fixture(scope="module", autouse=True)
def _report_measurements():
    """Each module's measured SIGKILL-to-continuation gaps, summarised once it is done."""
    yield
    if MEASURED:
        gaps = sorted(s for _, s in MEASURED)
        print(
            f"\n[crash-timing] summary over {len(gaps)} kills ({lease_settings()}): "
            f"min {gaps[0]:.2f}s, median {gaps[len(gaps) // 2]:.2f}s, max {gaps[-1]:.2f}s"
        )
