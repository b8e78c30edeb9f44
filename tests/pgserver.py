"""A private PostgreSQL server for drills that restart or stop the database.

The suite's own server (scripts/with-postgres.sh) is shared by every test process, so a test that
restarts PostgreSQL starts its own here: initdb into a temp dir, a free loopback port, the same
test-friendly settings, and `stop()` / `start()` / `restart()` that really stop the server
(`pg_ctl -m fast` terminates every connection, as a managed database's restart does).
Processes under test get `url` as their DATABASE_URL; `migrate()` prepares the schema and the demo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from tests.procs import ROOT, free_port


def _pg_bin() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if not found:
        raise RuntimeError("PostgreSQL server binaries (initdb) not found")
    return Path(found).parent


class PrivatePostgres:
    def __init__(self, name: str = "drill") -> None:
        self.bin = _pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix=f"agentruns-{name}-pg."))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_postgres: list[str] = []
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres")
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.database = "agentruns"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_postgres, str(self.bin / tool), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w", "-o", options,
            "start",
        )  # fmt: skip

    def create_database(self) -> None:
        with psycopg.connect(
            f"postgres://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {self.database}")

    def stop(self, mode: str = "fast") -> None:
        """`fast` ends every session with "terminating connection due to administrator
        command"; `immediate` is a crash (no checkpoint, recovery at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def is_up(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def migrate(self, env: dict[str, str], seed: bool = True) -> None:
        """The schema (and the demo data) for processes pointed at this server."""
        env = {**env, "DATABASE_URL": self.url}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env,
            check=True,
        )  # fmt: skip
        if seed:
            subprocess.run(
                [sys.executable, "manage.py", "seed_demo"], cwd=ROOT, env=env, check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True)

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def wait_up(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_up():
            if time.monotonic() > deadline:
                raise TimeoutError("private PostgreSQL did not come up")
            time.sleep(0.1)
