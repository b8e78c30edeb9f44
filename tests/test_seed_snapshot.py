"""The `seeded` fixture's copy of seed_demo's rows (tests/seed_snapshot.py) is what the command
writes: the same tables, the same rows (their ids, foreign keys, timestamps and the random
passwords aside), the same links between them by name, its timestamps as of now."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.sql import emit_post_migrate_signal
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.utils import timezone

from agentruns.models import AccessGeneration, ToolRule
from support.models import Ticket
from tests import seed_snapshot

pytestmark = pytest.mark.django_db


class _Undo(Exception):
    pass


def _written(write) -> dict:
    """What `write()` leaves in the copy's tables (by content and by name), then undone."""
    found: dict = {}
    try:
        with transaction.atomic():
            before = _generation()
            write()
            found["generation_moved"] = _generation() != before
            found["rows"] = _rows()
            found["links"] = _links()
            found["newest"] = _newest()
            raise _Undo
    except _Undo:
        pass
    return found


def _generation() -> list[int]:
    return list(AccessGeneration.objects.filter(id=1).values_list("value", flat=True))


def _rows() -> dict[str, list[str]]:
    rows = {}
    with connection.cursor() as cursor:
        for table in seed_snapshot._snapshot.tables:
            cursor.execute(
                f"SELECT row_to_json(t)::text FROM {connection.ops.quote_name(table.name)} t"
            )
            kept = []
            for (text,) in cursor.fetchall():
                row = json.loads(text)
                for column in list(row):
                    if (
                        column == "id"
                        or column.endswith("_id")
                        or column in table.moved
                        or column == "password"
                    ):
                        del row[column]
                kept.append(json.dumps(row, sort_keys=True))
            rows[table.name] = sorted(kept)
    return rows


def _links() -> dict:
    from django.contrib.auth import get_user_model

    users = get_user_model().objects.order_by("username")
    return {
        "tickets": sorted(Ticket.objects.values_list("ticket_id", "order__order_id")),
        "users": [(u.username, sorted(u.groups.values_list("name", flat=True))) for u in users],
        "perms": sorted(
            Group.objects.values_list(
                "name", "permissions__content_type__app_label", "permissions__codename"
            )
        ),
        "rules": sorted(ToolRule.objects.values_list("policy__group__name", "tool", "allowed")),
        "logins": [u.has_usable_password() for u in users],
    }


def _newest() -> float:
    """How long ago the oldest of the rows' timestamps is, in seconds."""
    oldest = min(
        Ticket.objects.order_by("created_at").values_list("created_at", flat=True)[:1],
        default=timezone.now(),
    )
    return (timezone.now() - oldest).total_seconds()


def test_the_copy_writes_what_seed_demo_writes():
    _written(seed_snapshot.seed)  # the command itself, and the copy taken (or the copy)
    assert seed_snapshot._snapshot is not None, "an empty database: the copy is taken"
    names = {t.name for t in seed_snapshot._snapshot.tables}
    assert {"support_order", "support_ticket", "auth_user", "auth_group"} <= names, names
    assert seed_snapshot._restorable(seed_snapshot._snapshot)

    copied = _written(seed_snapshot.seed)
    commanded = _written(seed_snapshot._run_command)

    assert copied["rows"] == commanded["rows"]
    assert copied["links"] == commanded["links"]
    assert copied["rows"]["support_order"] and copied["links"]["perms"]
    assert copied["generation_moved"] and commanded["generation_moved"]
    assert copied["newest"] < 5, "the copy's timestamps are as of now"


def test_a_table_not_empty_gets_the_command_itself(django_user_model):
    seed_snapshot.seed()  # (whichever way: the copy exists afterwards)
    snapshot = seed_snapshot._snapshot
    assert snapshot is not None
    django_user_model.objects.filter(username="viewer").delete()
    assert not seed_snapshot._restorable(snapshot)  # (a user is there)
    seed_snapshot.seed()  # the command: it makes the missing viewer and leaves the rest
    assert django_user_model.objects.filter(username="viewer").exists()


def test_a_copy_is_not_used_where_a_sequence_would_give_its_ids_again():
    """A test that migrates a table away and back makes its id sequence afresh, at 1: the copy's
    ids would collide with the next row's, so the command runs instead."""
    seed_snapshot.seed()
    snapshot = seed_snapshot._snapshot
    (sequence,) = [s for s in snapshot.sequences if "support_order" in s]
    assert seed_snapshot._sequences_past(snapshot.sequences)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sequence_last_value(%s::regclass)", [sequence])
        (last,) = cursor.fetchone()
        try:
            cursor.execute("SELECT setval(%s::regclass, 1, false)", [sequence])  # (not undone)
            assert not seed_snapshot._sequences_past(snapshot.sequences)
        finally:
            cursor.execute("SELECT setval(%s::regclass, %s)", [sequence, last])
    assert seed_snapshot._sequences_past(snapshot.sequences)


def flush() -> None:
    """As a transactional test's teardown flushes (TransactionTestCase: sequences kept)."""
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)


@pytest.mark.django_db(transaction=True)
def test_a_flush_writes_back_what_post_migrate_writes():
    """A flush's content types and permissions (the signal's rows the first time, the copy of
    them after that) keep their ids from flush to flush, and the signal itself, sent after the
    copy was written, finds nothing missing."""

    def state() -> tuple[list, list]:
        return (
            sorted(ContentType.objects.values_list("id", "app_label", "model")),
            sorted(Permission.objects.values_list("id", "content_type_id", "codename", "name")),
        )

    flush()
    assert seed_snapshot._after_flush is not None, "the signal's rows are kept"
    first = state()
    assert first[0] and first[1]
    flush()
    assert state() == first

    emit_post_migrate_signal(0, False, DEFAULT_DB_ALIAS)
    assert state() == first
    # so a seeded test after a transactional one gets the seed copy, not the command
    seed_snapshot.seed()  # (the command or the copy: the copy exists afterwards)
    flush()
    assert seed_snapshot._restorable(seed_snapshot._snapshot)
