"""The conversations' migrations on data made before them: 0024 names the thread of each run of a
thread (from its turn), 0025 keeps the threads made before it as they were (a parked turn held
the thread: they are marked `chat`) while new threads are not."""

from __future__ import annotations

import pytest
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
