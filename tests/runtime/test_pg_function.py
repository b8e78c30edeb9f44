"""The PostgreSQL commit function (runtime/store/pg_function.py) and in-process runs (execute_inline)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import Run, RunEvent, Step, StepAttempt, StepKind
from agentruns.runtime.engine import journal
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.engine.lanes import CallerLane
from agentruns.runtime.engine.slice import SliceState
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.store import pg_function as pgcommit
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.workers.sweeper import sweep
from agentruns.services import execute_inline, start_run
from support.models import GatewayRefund
from tests import testkit
from tests.helpers import assert_gapless, event_types, leased_run, steps

pytestmark = pytest.mark.django_db


def _fence(run_id, owner: str) -> SliceState:
    """The slice state a commit is fenced on (the run, its lease owner)."""
    return SliceState(run_id=run_id, owner=owner, ttl=30, lane=CallerLane())


def test_installed_function_matches_the_models():
    """A model change without a migration that re-installs the function fails here."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [pgcommit.FUNCTION])
        (installed,) = cursor.fetchone()
    generated = pgcommit.function_sql(connection).split("$fn$")[1]
    assert installed.strip() == generated.strip()


def test_rows_round_trip_exactly():
    run = leased_run()
    now = timezone.now().replace(microsecond=123456)
    step = Step(
        id=uuid.uuid4(),
        run_id=run.id,
        index=0,
        kind=StepKind.TOOL,
        tool="t_echo",
        call_id="c-1",
        arguments={"text": "quote ' \" and \\ and ünïcode", "n": [1, 2.5, None]},
        idempotency_key="k-round-trip",
        status="succeeded",
        result=None,
        text="line\nbreak",
        started_at=now,
        finished_at=now + timedelta(microseconds=1),
    )
    attempt = StepAttempt(step=step, number=1, worker="me:1:abc", started_at=now, finished_at=now)
    journal.commit(
        _fence(run.id, "me:1:abc"),
        [("step.succeeded", {"step": 0, "at": now})],
        batch=WriteBatch().insert([step, attempt]),
    )
    stored = Step.objects.get(id=step.id)
    for field in ("arguments", "text", "idempotency_key", "started_at", "finished_at", "call_id"):
        assert getattr(stored, field) == getattr(step, field), field
    assert stored.result is None and stored.created_at is not None
    assert StepAttempt.objects.get(step=step).started_at == now
    event = RunEvent.objects.get(run=run, type="step.succeeded")
    assert event.data["at"] == now.isoformat()  # full precision in event data too


def test_a_lost_lease_writes_nothing():
    run = leased_run(owner="other:2:def")
    step = Step(
        id=uuid.uuid4(), run_id=run.id, index=0, kind=StepKind.MODEL, idempotency_key="k-lost"
    )
    events_before = RunEvent.objects.filter(run=run).count()
    with pytest.raises(LeaseLost), transaction.atomic():  # (the test's own transaction survives)
        journal.commit(_fence(run.id, "me:1:abc"), [("x", {})], batch=WriteBatch().insert([step]))
    assert not Step.objects.filter(id=step.id).exists()
    assert RunEvent.objects.filter(run=run).count() == events_before
    assert Run.objects.get(id=run.id).lease_owner == "other:2:def"


def test_a_lost_lease_rolls_back_the_callers_transaction_too():
    run = leased_run(owner="other:2:def")
    with pytest.raises(LeaseLost), transaction.atomic():
        GatewayRefund.objects.create(
            order_id="ORD-X", amount_cents=1, idempotency_key="k-rolled-back"
        )
        journal.commit(_fence(run.id, "me:1:abc"), [("x", {})], end_transaction=True)
    assert not GatewayRefund.objects.filter(idempotency_key="k-rolled-back").exists()


@pytest.mark.django_db(transaction=True)
def test_the_commit_can_end_the_callers_transaction():
    run = leased_run()
    hooks = []
    with transaction.atomic():
        GatewayRefund.objects.create(order_id="ORD-X", amount_cents=1, idempotency_key="k-folded")
        transaction.on_commit(lambda: hooks.append("ran"))
        journal.commit(_fence(run.id, "me:1:abc"), [("x", {})], end_transaction=True)
        assert connection.connection.info.transaction_status.name == "IDLE"  # COMMIT rode along
    assert hooks == ["ran"]
    assert GatewayRefund.objects.filter(idempotency_key="k-folded").exists()
    assert RunEvent.objects.filter(run=run, type="x").exists()


def test_execute_inline_creates_the_run_leased_and_runs_it():
    run, outcome = execute_inline(
        "script", {"script": [{"calls": [["t_echo", {"text": "a"}]]}, {"text": "ok"}]}
    )
    assert outcome == "succeeded"
    run.refresh_from_db()
    assert run.status == "succeeded" and run.output == "ok" and run.lease_owner == ""
    assert event_types(run)[:2] == ["run.created", "run.status"]
    assert_gapless(run)


def test_execute_inline_dedupes_on_the_key():
    first, _ = execute_inline("script", {"script": [{"text": "ok"}]}, dedupe_key="inline-1")
    again, outcome = execute_inline("script", {"script": [{"text": "ok"}]}, dedupe_key="inline-1")
    assert again.id == first.id and outcome == "succeeded"
    assert Run.objects.filter(dedupe_key="inline-1").count() == 1


def test_an_inline_run_whose_process_died_is_handed_to_the_queue():
    run = start_run("script", {"script": [{"text": "ok"}]}, claim_for="dead-host:1:abc").run
    stored = Run.objects.get(id=run.id)
    assert stored.status == "running" and stored.lease_owner == "dead-host:1:abc"
    assert not OrmQ.objects.exists()  # nothing enqueued: its process executes it
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    sweep()
    assert OrmQ.objects.count() == 1
    assert RunExecutor(run.id).advance() == "succeeded"


def test_failing_transactional_call_after_an_eager_read_reruns_the_read_only():
    testkit.FAILS["t_tx"] = 1  # fails inside the model's transaction: everything rolls back
    run = start_run(
        "script",
        {
            "script": [
                {"calls": [["t_echo", {"text": "a"}], ["t_tx", {"amount": 3}]]},
                {"text": "ok"},
            ]
        },
    ).run
    assert RunExecutor(run.id).advance() == "succeeded"
    echo, tx = steps(run, kind="tool")
    assert echo.status == "succeeded" and echo.attempts == 1
    assert tx.status == "succeeded" and tx.attempts == 1  # its eager try left no attempt behind
    assert GatewayRefund.objects.filter(order_id="ORD-TX").count() == 1
    assert len(testkit.CALLS["t_tx"]) == 2


def test_a_dedupe_conflict_inside_the_callers_transaction_leaves_it_usable(monkeypatch):
    first, _ = execute_inline("script", {"script": [{"text": "ok"}]}, dedupe_key="inline-race")
    # lose the pre-check, as a concurrent start would: the unique constraint decides
    monkeypatch.setattr(Run.objects, "filter", lambda *a, **k: Run.objects.none())
    with transaction.atomic():
        result = start_run("script", {"script": []}, dedupe_key="inline-race", claim_for="me:1:z")
        assert not result.created and result.run.id == first.id
        assert Run.objects.count() == 1  # the transaction still works


def test_the_store_loads_a_run_as_the_orm_does():
    """`load_run` (a prepared statement, Django's converters) reads every field as `get` does."""
    from agentruns.runtime.store import get_store

    run = start_run("script", {"script": [{"text": "hi ' \" ünï"}]}, enqueue_task=False).run
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now(), cost_usd="1.250000")
    loaded, expected = get_store().load_run(run.id), Run.objects.get(id=run.id)
    assert type(loaded) is Run and not loaded._state.adding and loaded._state.db == "default"
    for field in Run._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(expected, field.attname), field.name
    assert isinstance(loaded.input, dict) and isinstance(loaded.tool_snapshot, dict)
    with pytest.raises(Run.DoesNotExist):
        get_store().load_run(uuid.uuid4())
