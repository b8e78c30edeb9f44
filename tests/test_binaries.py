"""tests/binaries.py on a machine without a system program (simulated: TESTS_HIDE_BINARIES): the
tests that need it are skipped with the reason and how to install it, and with CI=true they
fail, so CI never passes by skipping. Each case is a real pytest run of real tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT

NEEDING = [
    "tests/web/test_oncall_metrics.py::test_promtool_accepts_the_rules",  # promtool
    "tests/stream/test_redis_nudges.py",  # a real redis-server
]


def pytest_without(programs: str, ci: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TESTS_HIDE_"))}
    env.update({"TESTS_HIDE_BINARIES": programs, "CI": ci})
    # its own database (SQLite, in memory for tests): never this suite's PostgreSQL test database
    env.update({"DATABASE_URL": "", "SQLITE_PATH": str(tmp_path / "db.sqlite3")})
    # without the property-testing plugins: these tests use neither, and importing them was more
    # than half of this pytest's CPU
    plugins_left_out = ["-p", "no:hypothesispytest", "-p", "no:schemathesis"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-n", "0", "-p", "no:cacheprovider"]
        + plugins_left_out
        + NEEDING,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_missing_program_skips_its_tests_with_the_reason(tmp_path):
    done = pytest_without("promtool,redis-server", ci="", tmp_path=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "2 skipped" in out, out
    assert "promtool is not installed" in out and "apt-get install prometheus" in out, out
    assert "redis-server is not installed" in out and "apt-get install redis-server" in out, out


def test_in_ci_a_missing_program_fails_its_tests(tmp_path):
    done = pytest_without("promtool,redis-server", ci="true", tmp_path=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # the promtool test fails, the Redis test's fixture errors: neither is skipped
    assert "1 failed, 1 error" in out and "skipped" not in out, out
    assert "CI=true: a missing program fails, never skips" in out, out
