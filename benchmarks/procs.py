"""Processes of the benchmarks: a real `qcluster` of this checkout, and stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_qcluster(database_url: str, **env: object) -> subprocess.Popen:
    """`manage.py qcluster` on `database_url` (postgres://...), in its own process group."""
    full = {**os.environ, "DATABASE_URL": database_url, **{k: str(v) for k, v in env.items()}}
    return subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (q2 hangs on a group SIGTERM, and nothing here needs a
    graceful stop), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
