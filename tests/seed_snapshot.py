"""seed_demo's rows for the `seeded` fixture: made by the command itself once per test process,
then written back with one INSERT a table.

The command makes its rows one `get_or_create` at a time: about 480 statements, 2-3 s a test on
the suite's busy PostgreSQL (0.3 s of it CPU, the rest round trips), in well over a hundred
tests. Here the first `seeded` test of a process runs the real command and keeps what it
wrote: every table whose rows it added (they were all empty before), each as JSON. A later
test gets the same rows (the same ids: the sequences are past them, rolled back or truncated
as the test's data is) with `INSERT ... SELECT FROM json_populate_recordset`, its timestamps
moved by the time since, as if the command had just run. The rows it writes to cause what the
command's do (the access generation's triggers fire; no model of theirs has signal receivers).

The copy is used only where it is exactly what the command would do: when every table it
writes to is empty, and the rows outside it that its rows point to (the permissions a group
holds, by id) are unchanged since. Any other state (a user made before, a table not empty)
runs the command itself. tests/test_seed_snapshot.py compares the two.

A transactional test ends with Django's `flush`: every table emptied, then the post_migrate
signal, whose receivers (content types, permissions) write their ~300 rows back one query per
app and model, with new ids. That cost ~0.25 s of the test process's CPU per test, and the new
ids made the seed copy stale (the command ran again in the next seeded test, in every
transactional one). So the rows the receivers wrote after the process's first flush are kept
the same way (`after_flush`), and a later flush writes them back, with their ids, instead of
sending the signal: only when the tables they go to are empty and the receivers are the same
ones; otherwise the signal is sent. tests/test_seed_snapshot.py checks that the signal then
finds nothing to add.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management import sql as management_sql
from django.core.management.commands import flush
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models.signals import post_migrate
from django.utils import timezone

from agentruns.models import AccessGeneration

# bumped by the watched tables' own triggers on every write, as the command's writes bump it
NOT_COPIED = {AccessGeneration._meta.db_table}


@dataclass
class Table:
    name: str
    columns: list[str]  # the ones an INSERT may name (no generated column)
    moved: set[str]  # timestamp columns: shifted by the time since the copy
    rows: str  # json_agg of the rows


@dataclass
class Snapshot:
    tables: list[Table]
    outside: list[str]  # tables outside the copy that its rows point to
    fingerprint: str  # of `outside`'s rows when the copy was taken
    taken_at: datetime
    # each table's id sequence and the highest id in the copy: the copy's ids are free only
    # while the sequence is past them (a test that migrates a table away and back makes it
    # afresh, at 1)
    sequences: dict[str, int] = field(default_factory=dict)


_snapshot: Snapshot | None = None
_after_flush: tuple[Snapshot, list] | None = None  # post_migrate's rows, and its receivers


def seed() -> None:
    """What `call_command("seed_demo")` leaves in the database, from the copy where it can."""
    global _snapshot
    if connection.vendor != "postgresql":  # (the copy is written with PostgreSQL's JSON)
        _run_command()
        return
    if _snapshot is not None and _restorable(_snapshot):
        _restore(_snapshot)
        return
    before = _counts(_tables())
    _run_command()
    after = _counts(list(before))
    written = [t for t in before if after[t] != before[t] and t not in NOT_COPIED]
    if all(before[t] == 0 for t in written):
        _snapshot = _take(written)


def _run_command() -> None:
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", stdout=devnull)


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _tables() -> list[str]:
    return connection.introspection.django_table_names(only_existing=True, include_views=False)


def _counts(tables: list[str]) -> dict[str, int]:
    sql = " UNION ALL ".join(f"SELECT %s, count(*) FROM {_q(t)}" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(sql, tables)
        return dict(cursor.fetchall())


def _fingerprint(tables: list[str]) -> str:
    if not tables:
        return ""
    parts = " || ".join(
        f"coalesce((SELECT md5(json_agg(x ORDER BY x::text)::text) FROM {_q(t)} x), '-')"
        for t in tables
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {parts}")
        return cursor.fetchone()[0]


def _take(names: list[str]) -> Snapshot:
    tables, outside, sequences = [], set(), {}
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s "
                "AND is_generated = 'NEVER' ORDER BY ordinal_position",
                [name],
            )
            described = cursor.fetchall()
            cursor.execute(f"SELECT json_agg(t)::text FROM {_q(name)} t")
            rows = cursor.fetchone()[0]
            tables.append(
                Table(
                    name=name,
                    columns=[c for c, _ in described],
                    moved={c for c, kind in described if kind.startswith("timestamp")},
                    rows=rows,
                )
            )
            relations = connection.introspection.get_relations(cursor, name)
            outside |= {table for _, table in relations.values() if table not in names}
            key = connection.introspection.get_primary_key_column(cursor, name)
            cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [_q(name), key])
            sequence = cursor.fetchone()[0]
            if sequence is not None and rows is not None:
                cursor.execute(f"SELECT max({_q(key)}) FROM {_q(name)}")
                sequences[sequence] = cursor.fetchone()[0]
    outside_tables = sorted(outside)
    fingerprint = _fingerprint(outside_tables)
    return Snapshot(tables, outside_tables, fingerprint, timezone.now(), sequences)


def _restorable(snapshot: Snapshot) -> bool:
    counts = _counts([t.name for t in snapshot.tables])
    if any(counts.values()) or not _sequences_past(snapshot.sequences):
        return False
    return _fingerprint(snapshot.outside) == snapshot.fingerprint


def _sequences_past(highest: dict[str, int]) -> bool:
    if not highest:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT bool_and(coalesce(pg_sequence_last_value(s::regclass) >= h, false)) "
            "FROM unnest(%s::text[], %s::bigint[]) AS t(s, h)",
            [list(highest), list(highest.values())],
        )
        return bool(cursor.fetchone()[0])


def _restore(snapshot: Snapshot) -> None:
    since = timezone.now() - snapshot.taken_at
    with transaction.atomic(), connection.cursor() as cursor:  # (foreign keys: at its end)
        for table in snapshot.tables:
            names = ", ".join(_q(c) for c in table.columns)
            values = ", ".join(
                f"r.{_q(c)} + %(since)s" if c in table.moved else f"r.{_q(c)}"
                for c in table.columns
            )
            cursor.execute(
                f"INSERT INTO {_q(table.name)} ({names}) SELECT {values} "
                f"FROM json_populate_recordset(NULL::{_q(table.name)}, %(rows)s) r",
                {"since": since, "rows": table.rows},
            )


# --- after a flush --------------------------------------------------------------------------
def _receivers() -> list:
    return [receiver[0] for receiver in post_migrate.receivers]  # (their lookup keys)


def after_flush(verbosity: int, interactive: bool, db: str, **kwargs) -> None:
    """What `flush` calls once it emptied the tables (`emit_post_migrate_signal`): the signal's
    rows from the copy where it can, else the signal itself (the first time, kept)."""
    global _after_flush
    emit = management_sql.emit_post_migrate_signal
    if db != DEFAULT_DB_ALIAS or connection.vendor != "postgresql" or kwargs:
        emit(verbosity, interactive, db, **kwargs)
        return
    if _after_flush is not None:
        snapshot, receivers = _after_flush
        if receivers == _receivers() and _restorable(snapshot):
            _restore(snapshot)
            ContentType.objects.clear_cache()  # (as create_contenttypes does first)
            return
    tables = _tables()
    before = _counts(tables)
    emit(verbosity, interactive, db, **kwargs)
    after = _counts(tables)
    written = [t for t in tables if after[t] != before[t] and t not in NOT_COPIED]
    if all(before[t] == 0 for t in written):
        _after_flush = (_take(written), _receivers())


def install_after_flush() -> None:
    """Have `flush` (a transactional test's teardown) call `after_flush` for the signal."""
    flush.emit_post_migrate_signal = after_flush
