"""Processes of the benchmarks: a real `qcluster` of this checkout, a checkout's web process
(daphne), and stopping them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUOTAS_OFF_THE_WAY = {  # metered as usual, never refusing within a burst
    "AGENTRUNS_START_BURST": "1000000",
    "AGENTRUNS_START_PER_SECOND": "1000",
    "AGENTRUNS_RUNS_IN_FLIGHT_PER_USER": "1000000",
}


def start_qcluster(
    database_url: str,
    checkout: Path = ROOT,
    base_env: Mapping[str, str] | None = None,
    **env: object,
) -> subprocess.Popen:
    """`checkout`'s `manage.py qcluster` on `database_url` (postgres://...), in its own process
    group; its environment: `base_env` (default: this process's) with `env` on top."""
    full = {
        **(os.environ if base_env is None else base_env),
        "DATABASE_URL": database_url,
        **{k: str(v) for k, v in env.items()},
    }
    return subprocess.Popen(
        [python_for(checkout), "manage.py", "qcluster"],
        cwd=checkout,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def python_for(checkout: Path) -> str:
    """The interpreter of `checkout`: its own `.venv` when it has one (an older checkout pins
    other versions), else this process's."""
    own = Path(checkout) / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (q2 hangs on a group SIGTERM, and nothing here needs a
    graceful stop), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def start_web(checkout: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`checkout`'s daphne (`config.serve` as the Procfile runs it; a checkout older than that
    module: plain daphne) on a free-ish port, once its /healthz answers: (process, base URL)."""
    import httpx

    port = 20000 + uuid.uuid4().int % 20000
    serve = "config.serve" if (checkout / "config" / "serve.py").exists() else "daphne"
    web = subprocess.Popen(
        [
            python_for(checkout),
            "-m",
            serve,
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/healthz", timeout=2)
            return web, url
        except httpx.HTTPError:
            if time.monotonic() > deadline or web.poll() is not None:
                stop_web(web)
                raise
            time.sleep(0.2)


def stop_web(web: subprocess.Popen) -> None:
    """A graceful stop of a web process started by `start_web`."""
    web.terminate()
    web.wait(timeout=30)
