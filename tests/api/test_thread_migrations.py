"""The conversations' migrations on data made before them: 0024 names the thread of each run of a
thread (from its turn), 0025 keeps the threads made before it as they were (a parked turn held
the thread: they are marked `chat`) while new threads are not; 0027 makes every key its
sender's."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("agentruns", "0023_threads")]
AFTER = [("agentruns", "0025_thread_chat")]


def migrate(targets: list[tuple[str, str]]):  # noqa: ANN201  (the state's apps)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_runs_learn_their_thread_and_old_threads_keep_their_rule():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("agentruns")
    try:
        old = migrate(BEFORE)
        Run, Thread = old.get_model("agentruns", "Run"), old.get_model("agentruns", "Thread")
        ThreadTurn = old.get_model("agentruns", "ThreadTurn")
        thread = Thread.objects.create(
            id="t-old", agent="a", revision="r", updated_at=timezone.now()
        )
        turned = Run.objects.create(agent="a", input={"message": "hi"})
        alone = Run.objects.create(agent="a", input={"message": "no thread"})
        ThreadTurn.objects.create(thread=thread, run=turned, author="customer", text="hi")

        new = migrate(AFTER)
        Run, Thread = new.get_model("agentruns", "Run"), new.get_model("agentruns", "Thread")
        assert Run.objects.get(id=turned.id).thread_id == "t-old"
        assert Run.objects.get(id=alone.id).thread_id is None
        assert Thread.objects.get(id="t-old").chat is True
        made = Thread.objects.create(id="t-new", agent="a", revision="r", updated_at=timezone.now())
        assert Thread.objects.get(id=made.id).chat is False
    finally:
        migrate(latest)


KEYS_BEFORE = [("agentruns", "0026_hook_receipts")]
KEYS_AFTER = [("agentruns", "0027_keys_are_their_senders")]
LEGACY_NAMESPACE = uuid.UUID("6f1d5c52-3f0e-4f55-9d3c-2a7c4b8e9a10")


def test_keys_made_before_0027_stay_their_senders():
    """0027: a keyed run's key becomes its starter's (a repeat still finds it), a thread that
    `"thread": true` derived for its maker's key is remembered as theirs, and a thread someone
    else made at an id derived for another user (the audit's pre-empted id) is nobody's key."""
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("agentruns")
    try:
        old = migrate(KEYS_BEFORE)
        User = old.get_model(*settings.AUTH_USER_MODEL.split("."))
        Run, Thread = old.get_model("agentruns", "Run"), old.get_model("agentruns", "Thread")
        ThreadTurn = old.get_model("agentruns", "ThreadTurn")
        alice = User.objects.create(username="alice")
        mallory = User.objects.create(username="mallory")
        keyed = Run.objects.create(agent="a", input={}, dedupe_key="k-1", created_by=alice)
        system = Run.objects.create(agent="a", input={}, dedupe_key="k-2")

        def thread(key: str, derived_for, made_by) -> str:
            thread_id = str(uuid.uuid5(LEGACY_NAMESPACE, f"{derived_for.pk}:a:{key}"))
            Thread.objects.create(
                id=thread_id, agent="a", revision="r", updated_at=timezone.now(), created_by=made_by
            )
            run = Run.objects.create(agent="a", input={}, created_by=made_by)
            ThreadTurn.objects.create(
                thread_id=thread_id,
                run=run,
                author="customer",
                text="hi",
                client_id=key,
                user=made_by,
            )
            return thread_id

        hers = thread("ticket-1", alice, alice)
        taken = thread("ticket-2", alice, mallory)  # made first by another user

        new = migrate(KEYS_AFTER)
        Run = new.get_model("agentruns", "Run")
        ThreadKey = new.get_model("agentruns", "ThreadKey")
        assert Run.objects.get(id=keyed.id).dedupe_owner == str(alice.pk)
        assert Run.objects.get(id=system.id).dedupe_owner == ""
        remembered = {(k.user_id, k.agent, k.key): k.thread_id for k in ThreadKey.objects.all()}
        assert remembered == {(alice.pk, "a", "ticket-1"): hers}
        assert taken not in remembered.values()
    finally:
        migrate(latest)
