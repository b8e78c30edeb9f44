"""Real processes for tests: the ASGI server (daphne) and the worker (qcluster), and what a test
does with them over HTTP (start a run, read the refund gateway's ledger) or waits for.

Both run against the test database pytest-django created, so tests that use them must be
`@pytest.mark.django_db(transaction=True)` (the processes only see committed rows).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from django.db import connection

from agentruns.models import Run
from tests import binaries

ROOT = Path(__file__).resolve().parent.parent
_random = random.SystemRandom()  # not the seeded global one: xdist workers must not agree


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections' source ports."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port no process holds, for a server a test starts (and may stop and start again on it).

    Picked below the kernel's ephemeral range: every outgoing connection on the machine (the
    other xdist workers' database, Redis and HTTP clients) takes its source port from that range,
    so a port from it, free when asked, can be taken before the server binds it or while it is
    down for an outage drill. A port below the range is only ever taken by another bind.
    """
    low = _ephemeral_low()
    below = range(max(1024, low - 12000), low)
    tries = 200 if len(below) >= 1000 else 0  # no room below the range: the kernel's pick
    for port in [_random.choice(below) for _ in range(tries)] + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")  # unreachable: port 0 always binds


def test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def base_env(**overrides: object) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": test_database_url(),
            "SCRIPTED_MODEL_DELAY_MS": "0",
            "AGENTRUNS_LEASE_TTL_SECONDS": "2",
            "AGENTRUNS_SWEEP_INTERVAL_SECONDS": "0.5",
            "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
            "Q_TIMEOUT": "60",
            # q2's pusher waits for a doorbell's NOTIFY and polls an empty queue this often (for
            # doorbells due later, and on SQLite): the product's default. At 0.05 each idle
            # worker spent ~0.05 s of CPU a second on polls, with as much again in PostgreSQL
            "Q_POLL": "0.1",
            "Q_WORKERS": "2",
            "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
        }
    )
    env.pop("AGENTRUNS_FAILPOINTS", None)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log_path = args, env, log
        self.popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        self.log_file = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=self.env,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup runs, exactly like a crash."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)
        self.log_file.close()

    def stop(self) -> None:
        # a test wants no drain here (tests/crash/test_stop_signals.py holds the graceful stop)
        self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stacks(self) -> str:
        """Every thread's stack in every process of the group (py-spy, from the venv), for a
        failure message: where a stuck cluster waits is what its log cannot say."""
        py_spy = Path(sys.executable).with_name("py-spy")
        if not self.alive or not py_spy.exists():
            return ""
        found = subprocess.run(
            ["pgrep", "-g", str(self.popen.pid)], capture_output=True, text=True, check=False
        )
        dumps = []
        for pid in found.stdout.split():
            dump = subprocess.run(
                [str(py_spy), "dump", "--pid", pid], capture_output=True, text=True, check=False
            )
            dumps.append(f"--- stacks of {pid}\n{dump.stdout or dump.stderr}")
        return "\n".join(dumps)[-20000:]


def start_web(tmp_path: Path, port: int | None = None, **env: object) -> tuple[Proc, str]:
    port = port or free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "config.serve",  # daphne as the Procfile runs it (the access log masks credentials)
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ],
        base_env(**env),
        tmp_path / f"web-{port}.log",
    ).start()
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    return proc, url


@contextmanager
def module_web(tmp_path_factory, django_db_blocker, **env: object) -> Iterator[str]:
    """One daphne for a whole module (the body of a module-scoped fixture that also asks for
    `django_db_setup`): its URL. Starting one costs seconds; tests that only need a live web or
    refund gateway share it. Its ledger is the database's, so each test still sees only its own
    refunds (the tables are truncated after every transactional test)."""
    with django_db_blocker.unblock():
        proc, url = start_web(tmp_path_factory.mktemp("web"), **env)
    try:
        yield url
    finally:
        proc.kill()


@contextmanager
def module_web_and_worker(
    tmp_path_factory, django_db_blocker, **env: object
) -> Iterator[tuple[str, Proc]]:
    """`module_web` and a worker beside it, both with `env` (the worker's refund gateway is the
    web's): the URL and the worker."""
    with module_web(tmp_path_factory, django_db_blocker, **env) as url:
        with django_db_blocker.unblock():
            worker = start_worker(
                tmp_path_factory.mktemp("worker"), REFUND_GATEWAY_URL=url + "/gateway", **env
            )
        try:
            yield url, worker
        finally:
            worker.kill()


def wait_http(url: str, proc: Proc | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive:
            raise RuntimeError(f"server exited:\n{proc.log()}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def start_worker(tmp_path: Path, name: str = "worker", **env: object) -> Proc:
    return Proc(
        [sys.executable, "manage.py", "qcluster"], base_env(**env), tmp_path / f"{name}.log"
    ).start()


def wait_until(predicate, timeout: float = 60, interval: float = 0.1, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {message}")


def wait_finished(run: Run | uuid.UUID | str, *procs: Proc, timeout: float = 120) -> Run:
    """Wait until the run is terminal and return its row; on timeout, fail with `procs`' logs."""
    run_id = run.id if isinstance(run, Run) else run

    def finished() -> Run | None:
        row = Run.objects.get(id=run_id)
        return row if row.is_terminal else None

    try:
        return wait_until(
            finished, timeout=timeout, interval=0.2, message=f"run {run_id} to finish"
        )
    except TimeoutError:
        logs = "\n".join(f"--- {p.log_path.name}\n{p.log()}\n{p.stacks()}" for p in procs)
        raise AssertionError(f"run {run_id} did not finish\n{logs}") from None


def start_run_over_http(base_url: str, token: str, run_input: dict, agent: str = "refund") -> str:
    """Start a run through the JSON API of the server at `base_url`, as a client would: its id."""
    response = httpx.post(
        f"{base_url}/api/runs",
        json={"agent": agent, "input": run_input},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def gateway_refunds(base_url: str, order_id: str | None = None) -> list[dict]:
    """The refunds the real gateway served at `base_url` says it executed (for `order_id`)."""
    params = {"order_id": order_id} if order_id is not None else {}
    response = httpx.get(f"{base_url}/gateway/refunds", params=params, timeout=30)
    response.raise_for_status()
    return response.json()["refunds"]


def run_manage(
    env: dict[str, str], *args: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    """`python manage.py <args>` in a subprocess with `env`; the caller checks the outcome."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def manage(env: dict[str, str], *args: str) -> str:
    """`python manage.py <args>` that must succeed; its output."""
    done = run_manage(env, *args)
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


PREPARE_DEMO = """
from django.core.management import call_command
call_command("migrate", interactive=False, verbosity=0)
call_command("seed_demo")
call_command("create_api_token", "lead")
"""


def prepare_demo(env: dict[str, str], then: str = "") -> list[str]:
    """`manage.py migrate`, `seed_demo` and `create_api_token lead` (then the Python code `then`)
    in one Django process instead of one each: a process start costs about 2 s of CPU. The
    output's lines: seed_demo's, the token alone, then `then`'s."""
    return manage(env, "shell", "-c", PREPARE_DEMO + then).strip().splitlines()


def sqlite_env(db_path: Path, base_url: str, **extra: object) -> dict[str, object]:
    """Overrides for `base_env`: an empty DATABASE_URL selects the embedded SQLite default."""
    return {
        "DATABASE_URL": "",
        "SQLITE_PATH": db_path,
        "APP_BASE_URL": base_url,
        "REFUND_GATEWAY_URL": base_url + "/gateway",
        "SCRIPTED_MODEL_DELAY_MS": 1,
        **extra,
    }


class RedisServer:
    """A real redis-server on a free loopback port (no persistence)."""

    def __init__(self, port: int, popen: subprocess.Popen) -> None:
        self.port, self.popen = port, popen
        self.url = f"redis://127.0.0.1:{port}/0"

    def client(self):  # (redis is imported only where a test needs it)
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        self.popen.kill()
        self.popen.wait(timeout=10)


def start_redis(directory: Path, port: int | None = None) -> RedisServer:
    """Start redis-server in `directory` (its log there) and wait until it answers; `port`: the
    one a stopped server had (a restart)."""
    port = port or free_port()
    popen = subprocess.Popen(
        [
            binaries.require("redis-server", "a real Redis"),
            *("--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(directory)),
        ],
        stdout=open(directory / "redis.log", "ab"),  # the server process owns it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = RedisServer(port, popen)
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.client().ping():
                return server
        except Exception:
            if time.monotonic() > deadline or popen.poll() is not None:
                popen.kill()
                raise
            time.sleep(0.05)
