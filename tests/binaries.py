"""The system programs tests and benchmarks need beyond Python's packages, found in one place.

Redis (`redis-server`), Chromium, `promtool`, Node.js/npm and `ss` are Debian packages that `.ci/run`
installs; a developer's machine may lack any of them. `require(name)` returns the program's
path, or says what is missing and how to install it:
- in a test, without CI: the test is skipped with that reason (pytest's summary lists it);
- in a test with `CI=true` (`.ci/run` sets it): the test fails with it, so CI never passes by
  skipping;
- outside pytest (benchmarks, scripts): it raises `Missing`, which the caller reports and skips.

`TESTS_HIDE_BINARIES=redis-server,chromium` makes those look missing (a fresh machine,
simulated: tests/test_binaries.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# how a Debian machine gets each (what .ci/run installs); a program's path may be overridden
INSTALL = {
    "redis-server": "apt-get install redis-server",
    "chromium": "apt-get install chromium",
    "promtool": "apt-get install prometheus",
    "node": "apt-get install nodejs (Node.js 20 or later)",
    "npm": "apt-get install npm",
    "ss": "apt-get install iproute2",
}
OVERRIDES = {"chromium": "CHROMIUM_PATH"}  # an environment variable naming the program's path
HIDE_VARIABLE = "TESTS_HIDE_BINARIES"


class Missing(Exception):
    """A system program is not installed; the message says which and how to install it."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _hidden() -> set[str]:
    return {n.strip() for n in os.environ.get(HIDE_VARIABLE, "").split(",") if n.strip()}


def find(name: str) -> str | None:
    """The program's path: its override variable, else the PATH; None when it is not there."""
    if name in _hidden():
        return None
    override = os.environ.get(OVERRIDES.get(name, ""), "")
    if override:
        return override if Path(override).is_file() and os.access(override, os.X_OK) else None
    return shutil.which(name)


def missing_reason(name: str, needed_for: str = "") -> str:
    what = f" (needed for {needed_for})" if needed_for else ""
    return f"{name} is not installed{what}: {INSTALL.get(name, f'install {name}')}"


def require(name: str, needed_for: str = "") -> str:
    """The program's path; when it is missing: skip the test, fail it in CI, or raise `Missing`
    outside pytest."""
    found = find(name)
    if found:
        return found
    reason = missing_reason(name, needed_for)
    if "PYTEST_CURRENT_TEST" not in os.environ:
        raise Missing(reason)
    import pytest  # only ever inside a test

    if in_ci():
        pytest.fail(f"{reason}; CI=true: a missing program fails, never skips", pytrace=False)
    pytest.skip(reason)
