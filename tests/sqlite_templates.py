"""SQLite files for the tests of the embedded default (no DATABASE_URL), copied from templates.

A test that needs a migrated SQLite file, or one as `prepare_demo` leaves it (seed_demo's
orders and users, the lead's API token), gets a copy of a template made once per suite run by
the same commands (`manage.py migrate`; `prepare_demo` on a copy of the migrated one), in the
run's template directory (tests/pgserver.py: named by the suite's main process, removed at its
end), under a lock, so xdist's workers make each only once. A migrate on SQLite costs a Django
process and seconds of CPU: it was paid by every such test. Tests of the commands themselves
(tests/support/test_make_run_sqlite.py) still run them.
"""

from __future__ import annotations

import fcntl
import sqlite3
from contextlib import closing
from pathlib import Path

from tests.pgserver import run_template_dir
from tests.procs import base_env, manage, prepare_demo, sqlite_env


def migrated_sqlite(db_path: Path, seeded: bool = False) -> list[str]:
    """A copy of the migrated template at `db_path` (`seeded`: of the seeded one); the output
    lines of the commands that made it (prepare_demo's for the seeded one, the token last)."""
    kind = "seeded" if seeded else "migrated"
    root = run_template_dir()
    template, output = root / f"sqlite-{kind}.sqlite3", root / f"sqlite-{kind}.out"
    with open(root / "sqlite.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not output.exists():
            _build(template, output, seeded)
    _copy(template, db_path)
    return output.read_text().splitlines()


def _build(template: Path, output: Path, seeded: bool) -> None:
    """Made under another name, then renamed: the output's presence says the template is whole
    (the caller holds the lock)."""
    building = template.with_name(template.name + ".building")
    env = base_env(**sqlite_env(building, "http://127.0.0.1:1"))
    if seeded:
        root = template.parent
        migrated = root / "sqlite-migrated.sqlite3"
        if not (root / "sqlite-migrated.out").exists():
            _build(migrated, root / "sqlite-migrated.out", seeded=False)
        _copy(migrated, building)
        lines = prepare_demo(env)  # (its migrate finds nothing to do)
    else:
        manage(env, "migrate", "--noinput", "-v0")
        lines = []
    _copy(building, template)  # (the backup folds the WAL in: one self-contained file)
    output.write_text("".join(f"{line}\n" for line in lines))


def _copy(source: Path, target: Path) -> None:
    """SQLite's online backup: a consistent copy, whatever is still in the source's WAL."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
