"""Retention (runtime/retention.py, `manage.py purge_runs`, AGENTRUNS_RETENTION_DAYS) on the real
PostgreSQL: runs that finished before the cut-off go with every row kept for them (steps,
attempts, events, inbox items with their decisions and mail notices, webhook deliveries sent or
given up); queued, running, waiting and recent runs are untouched, and so is a delivery still to
be sent. A dry run deletes nothing and counts what the purge then deletes; more runs than one
batch take several transactions. The command on SQLite; the worker's hourly purge in a real
`qcluster`."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.models import (
    JournalEntry,
    ResumePoint,
    Run,
    RunEvent,
    RunStatus,
    Step,
    StepAttempt,
    Wait,
)
from agentruns.runtime import retention
from agentruns.services import cancel_run
from approvals import services as approvals
from approvals.models import Approval, ApprovalDecision, MailNotice, WebhookDelivery
from approvals.notifications.signing import new_secret
from tests.helpers import advance, leased_run, script_run
from tests.procs import base_env, manage, sqlite_env, start_worker, wait_until
from tests.sqlite_templates import migrated_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

# every table a run's rows are in (the journal's waits and entries go with their run too)
MODELS = (
    Run,
    Step,
    StepAttempt,
    RunEvent,
    Wait,
    JournalEntry,
    ResumePoint,
    Approval,
    ApprovalDecision,
    MailNotice,
    WebhookDelivery,
)
LONG_AGO = timedelta(days=100)
PAY = [{"calls": [["t_pay", {"amount": 500}]]}, {"text": "done"}]  # parks for approval


def rows() -> dict[str, int]:
    return {model._meta.db_table: model.objects.count() for model in MODELS}


def removed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        table: before[table] - after[table] for table in before if before[table] != after[table]
    }


def aged(*runs: Run) -> None:
    """Created and (when finished) finished LONG_AGO."""
    then = timezone.now() - LONG_AGO
    ids = [run.id for run in runs]
    Run.objects.filter(id__in=ids).update(created_at=then)
    Run.objects.filter(id__in=ids, finished_at__isnull=False).update(finished_at=then)


@pytest.fixture
def world(settings, lead):
    """Old runs of every ending with inbox items and deliveries, and the runs that must stay."""
    settings.AGENTRUNS_WEBHOOK_URL = "http://127.0.0.1:9/hooks"
    settings.AGENTRUNS_WEBHOOK_SECRET = new_secret()
    done = advance(script_run([{"calls": [["t_echo", {"text": "hi"}]]}, {"text": "ok"}]))
    rejected = advance(script_run(PAY))
    item = Approval.objects.get(run=rejected)
    approvals.decide(item.id, "reject", lead, reason="not this one")
    rejected = advance(rejected)
    failed = advance(script_run([{"calls": [["t_explode", {}]]}]))
    cancelled = advance(script_run(PAY))
    cancel_run(cancelled.id, user=lead, reason="customer withdrew")
    waiting = advance(script_run(PAY))  # parked on a pending item: never purged
    queued = script_run([{"text": "later"}])
    running = leased_run()
    recent = advance(script_run([{"text": "fresh"}]))
    old = [done, rejected, failed, cancelled]
    aged(*old, waiting, queued, running)
    assert [Run.objects.get(id=r.id).status for r in old] == [
        RunStatus.SUCCEEDED,
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    ]
    # the outbox: the old runs' deliveries sent or given up, but one still to be sent
    deliveries = WebhookDelivery.objects.filter(run_id__in=[r.id for r in old]).order_by("id")
    assert deliveries.count() >= 4
    deliveries.update(status="delivered")
    deliveries.filter(run_id=failed.id).update(status="failed")
    pending = deliveries.filter(run_id=rejected.id).last()
    WebhookDelivery.objects.filter(id=pending.id).update(status="pending")
    assert MailNotice.objects.filter(approval__run__in=old).exists()
    assert ApprovalDecision.objects.filter(approval__run=rejected).exists()
    return {
        "old": old,
        "kept": [waiting, queued, running, recent],
        "pending_delivery": pending.id,
    }


def test_old_finished_runs_go_with_every_row_kept_for_them_and_nothing_else(world):
    kept_ids = [r.id for r in world["kept"]]
    kept_before = {
        "steps": Step.objects.filter(run_id__in=kept_ids).count(),
        "events": RunEvent.objects.filter(run_id__in=kept_ids).count(),
        "items": Approval.objects.filter(run_id__in=kept_ids).count(),
    }
    assert kept_before["items"] == 1  # the waiting run's pending item
    before = rows()
    counts = retention.purge(timedelta(days=90))
    assert counts == removed(before, rows())  # what it says it deleted is what went

    old_ids = [r.id for r in world["old"]]
    assert set(Run.objects.values_list("id", flat=True)) == set(kept_ids)
    assert counts[Run._meta.db_table] == 4
    assert not Step.objects.filter(run_id__in=old_ids).exists()
    assert not StepAttempt.objects.filter(step__run_id__in=old_ids).exists()
    assert not RunEvent.objects.filter(run_id__in=old_ids).exists()
    assert not Approval.objects.filter(run_id__in=old_ids).exists()
    assert not ApprovalDecision.objects.exists()  # (only the rejected run's item had one)
    assert not MailNotice.objects.exclude(approval__run_id__in=kept_ids).exists()
    # a delivery still to be sent stays; the sent and given-up ones went
    assert list(
        WebhookDelivery.objects.filter(run_id__in=old_ids).values_list("id", flat=True)
    ) == [world["pending_delivery"]]
    assert counts[WebhookDelivery._meta.db_table] >= 3
    # the runs that stay kept every row
    assert Step.objects.filter(run_id__in=kept_ids).count() == kept_before["steps"]
    assert RunEvent.objects.filter(run_id__in=kept_ids).count() == kept_before["events"]
    assert Approval.objects.filter(run_id__in=kept_ids, status="pending").count() == 1
    # and a second purge finds nothing
    assert retention.purge(timedelta(days=90)) == {}


def test_a_dry_run_deletes_nothing_and_counts_what_the_purge_deletes(world):
    before = rows()
    out = io.StringIO()
    call_command("purge_runs", "--older-than", "90d", "--dry-run", stdout=out)
    assert rows() == before
    dry = out.getvalue()
    assert dry.startswith("would delete (dry run, nothing deleted): 4 finished run(s)")
    out = io.StringIO()
    call_command("purge_runs", "--older-than", "2160h", stdout=out)  # 90 days in hours
    done = out.getvalue()
    assert done.startswith("deleted: 4 finished run(s) older than 2160h")
    assert dry.splitlines()[1:] == done.splitlines()[1:]  # the same count for every table
    gone = removed(before, rows())
    assert [line.split() for line in done.splitlines()[1:]] == [
        [table, str(gone[table])] for table in sorted(gone, key=lambda t: (t != "agentruns_run", t))
    ]


def test_more_runs_than_a_batch_take_several_transactions():
    runs = [advance(script_run([{"text": f"run {i}"}])) for i in range(7)]
    aged(*runs)
    recent = advance(script_run([{"text": "recent"}]))
    dry = retention.purge(timedelta(days=90), dry_run=True, batch=3)
    assert dry[Run._meta.db_table] == 7  # the dry run walks every batch too
    with CaptureQueriesContext(connection) as queries:
        counts = retention.purge(timedelta(days=90), batch=3)
    locks = [q["sql"] for q in queries.captured_queries if "SKIP LOCKED" in q["sql"]]
    assert len(locks) == 4  # three batches (3 + 3 + 1) and the look that finds none left
    assert all("LIMIT 3" in sql for sql in locks)
    assert counts == dry
    assert list(Run.objects.values_list("id", flat=True)) == [recent.id]


@pytest.mark.parametrize("age", ["90", "90x", "d", "0d", "-1d", "1.5.0h", "1e999d", ""])
def test_a_bad_age_is_a_command_error(age):
    with pytest.raises(CommandError, match="--older-than"):
        call_command("purge_runs", "--older-than", age, stdout=io.StringIO())


def test_the_purge_runs_on_sqlite_too(tmp_path):
    env = base_env(**sqlite_env(tmp_path / "db.sqlite3", "http://127.0.0.1:1"))
    migrated_sqlite(tmp_path / "db.sqlite3")
    code = (
        "from datetime import timedelta\n"
        "from django.utils import timezone\n"
        "from agentruns.models import Run\n"
        "from agentruns.services import start_run\n"
        "runs = [start_run('refund', {'order_id': f'ORD-10{i:02}'}, enqueue_task=False).run "
        "for i in range(1, 4)]\n"
        "then = timezone.now() - timedelta(days=2)\n"
        "Run.objects.filter(id__in=[r.id for r in runs[:2]]).update("
        "status='cancelled', created_at=then, finished_at=then)\n"
    )
    manage(env, "shell", "-c", code)
    out = manage(env, "purge_runs", "--older-than", "1d", "--batch", "1")
    assert "deleted: 2 finished run(s) older than 1d" in out
    assert "agentruns_run" in out and "agentruns_runevent" in out
    left = manage(
        env, "shell", "-c", "from agentruns.models import Run; print(Run.objects.count())"
    )
    assert left.strip().splitlines()[-1] == "1"


def test_the_worker_purges_when_retention_is_set(tmp_path):
    old = advance(script_run([{"text": "old"}]))
    aged(old)
    recent = advance(script_run([{"text": "recent"}]))
    worker = start_worker(tmp_path, AGENTRUNS_RETENTION_DAYS="30")
    try:
        wait_until(
            lambda: not Run.objects.filter(id=old.id).exists(),
            timeout=60,
            message="the worker's retention purge",
        )
    finally:
        worker.stop()
    assert list(Run.objects.values_list("id", flat=True)) == [recent.id]
    assert not RunEvent.objects.filter(run_id=old.id).exists()
