"""Engine unit tests on PostgreSQL: lifecycle, keys, leases, recovery, stop conditions."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agentruns.models import AttemptOutcome, Run, RunEvent, Step, StepAttempt, StepStatus
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.services import start_run
from approvals import services as approval_services
from approvals.models import Approval
from tests import testkit
from tests.helpers import advance, assert_gapless, events, race, script_run, steps

pytestmark = pytest.mark.django_db


def test_step_lifecycle_and_events():
    run = script_run(
        [
            {
                "text": "echo then charge",
                "calls": [["t_echo", {"text": "hi"}], ["t_charge", {"amount": 5}]],
            },
            {"text": "all done"},
        ]
    )
    run = advance(run)
    assert run.status == "succeeded"
    assert run.output == "all done"
    kinds = [(s.kind, s.tool, s.status, s.attempts) for s in steps(run)]
    assert kinds == [
        ("model", "", "succeeded", 1),
        ("tool", "t_echo", "succeeded", 1),
        ("tool", "t_charge", "succeeded", 1),
        ("model", "", "succeeded", 1),
    ]
    charge = steps(run)[2]
    assert charge.result == {"charged": 5, "key": charge.idempotency_key}
    assert StepAttempt.objects.filter(step__run=run).count() == 4
    assert run.lease_owner == "" and run.lease_expires_at is None
    types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
    assert types[0] == "run.created" and types[-1] == "run.status"
    assert "run.output" in types and "model.delta" in types
    assert_gapless(run)
    assert run.prompt_tokens > 0 and run.completion_tokens > 0


def test_idempotency_key_stable_across_retries():
    testkit.FAILS["t_charge"] = 2
    run = advance(script_run([{"calls": [["t_charge", {"amount": 7}]]}, {"text": "ok"}]))
    assert run.status == "succeeded"
    keys = {key for key, _, _ in testkit.CALLS["t_charge"]}
    attempts = [attempt for _, attempt, _ in testkit.CALLS["t_charge"]]
    step = steps(run)[1]
    assert keys == {step.idempotency_key}
    assert attempts == [1, 2, 3]
    outcomes = list(step.attempt_rows.order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["retrying", "retrying", "succeeded"]
    assert RunEvent.objects.filter(run=run, type="step.retry_scheduled").count() == 2


def test_retries_exhausted_fail_step_and_run_with_error_kept():
    testkit.FAILS["t_charge"] = 5
    run = advance(script_run([{"calls": [["t_charge", {"amount": 7}]]}]))
    assert run.status == "failed"
    assert "temporary outage" in run.error
    step = steps(run)[1]
    assert step.status == "failed" and step.attempts == 3


def test_fatal_tool_error_fails_run():
    run = advance(script_run([{"calls": [["t_explode", {}]]}, {"text": "never"}]))
    assert run.status == "failed"
    assert "card declined" in run.error
    assert steps(run)[1].status == "failed"
    assert len(steps(run)) == 2  # the model was not called again


@pytest.mark.parametrize(
    "call, error",
    [
        (["no_such_tool", {}], "not available"),
        (["t_charge", "{not json"], "not valid JSON"),
        (["t_charge", {"amount": "lots"}], "amount"),
        (["t_charge", {"amount": 1, "extra": 2}], "Additional properties"),
    ],
)
def test_bad_model_output_is_a_failed_step_fed_back(call, error):
    run = advance(script_run([{"calls": [call]}, {"text": "sorry, I will stop"}]))
    assert run.status == "succeeded", run.error
    bad = steps(run)[1]
    assert bad.status == "failed" and error in bad.error
    assert testkit.CALLS["t_charge"] == []


def test_tool_outside_snapshot_is_refused(monkeypatch):
    run = script_run([{"calls": [["t_echo", {"text": "x"}]]}, {"text": "ok"}])
    Run.objects.filter(id=run.id).update(tool_snapshot={"t_charge": {}})
    run = advance(run)
    assert steps(run)[1].status == "failed"
    assert "not available" in steps(run)[1].error
    assert testkit.CALLS["t_echo"] == []


@pytest.mark.django_db(transaction=True)
def test_lease_contention_one_worker_executes():
    testkit.GATE.clear()
    run = script_run([{"calls": [["t_charge", {"amount": 1}]]}, {"text": "ok"}])
    results = []

    def worker():
        results.append(RunExecutor(run.id).advance())
        connection.close()

    first = threading.Thread(target=worker)
    first.start()
    # wait until the first worker is inside the tool call, holding the lease
    for _ in range(200):
        if testkit.CALLS["t_charge"]:
            break
        threading.Event().wait(0.02)
    second = threading.Thread(target=worker)
    second.start()
    second.join(10)
    testkit.GATE.set()
    first.join(10)
    assert sorted(results) == ["busy", "succeeded"]
    assert len(testkit.CALLS["t_charge"]) == 1


def _simulate_dead_worker(step: Step) -> None:
    now = timezone.now()
    Step.objects.filter(id=step.id).update(status=StepStatus.RUNNING, attempts=1, started_at=now)
    StepAttempt.objects.create(step=step, number=1, worker="dead:1", started_at=now)
    Run.objects.filter(id=step.run_id).update(
        status="running", lease_owner="dead:1", lease_expires_at=now - timedelta(seconds=1)
    )


def test_recovery_reruns_key_tool_with_same_key():
    run = script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}])
    run = advance(run)  # parks on approval: the step exists, not yet executed
    step = steps(run)[1]
    # approved (the executor runs only the arguments an approval on record approved)
    approval_services.approve(Approval.objects.get(step=step).id, user=None)
    _simulate_dead_worker(step)
    run = advance(run)
    assert run.status == "succeeded"
    step.refresh_from_db()
    assert step.attempts == 2
    assert [a.outcome for a in step.attempt_rows.order_by("number")] == ["crashed", "succeeded"]
    assert testkit.CALLS["t_pay"] == [(step.idempotency_key, 2, {"amount": 500})]


def test_recovery_of_non_idempotent_tool_goes_to_reconciliation():
    run = script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}])
    run = advance(run)
    step = steps(run)[1]
    # re-point the parked step at the non-idempotent tool to simulate a crash mid-send
    Approval.objects.filter(step=step).delete()
    Step.objects.filter(id=step.id).update(tool="t_email", arguments={"to": "a@b.c"})
    _simulate_dead_worker(step)
    run = advance(run)
    step.refresh_from_db()
    assert run.status == "waiting"
    assert step.status == "unknown"
    approval = Approval.objects.get(step=step)
    assert approval.kind == "reconciliation" and approval.status == "pending"
    assert testkit.CALLS["t_email"] == []  # never re-sent
    assert step.attempt_rows.get().outcome == AttemptOutcome.UNKNOWN


def test_model_step_interrupted_is_superseded_and_rerun():
    run = script_run([{"text": "hello there"}])
    now = timezone.now()
    step = Step.objects.create(
        run=run,
        index=0,
        kind="model",
        idempotency_key="k-model",
        status="running",
        attempts=1,
        started_at=now,
    )
    StepAttempt.objects.create(step=step, number=1, worker="dead:1", started_at=now)
    Run.objects.filter(id=run.id).update(
        status="running",
        step_count=1,
        lease_owner="dead:1",
        lease_expires_at=now - timedelta(seconds=1),
    )
    run = advance(run)
    assert run.status == "succeeded" and run.output == "hello there"
    step.refresh_from_db()
    assert step.attempts == 2
    sup = RunEvent.objects.get(run=run, type="model.superseded")
    assert sup.data == {"step": 0, "attempt": 1}
    texts = [
        e.data["text"]
        for e in RunEvent.objects.filter(run=run, type="model.delta", data__attempt=2)
    ]
    assert "".join(texts) == "hello there"


def test_parking_for_approval():
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}]))
    assert run.status == "waiting"
    step = steps(run)[1]
    assert step.status == "waiting_approval"
    approval = Approval.objects.get(step=step)
    assert approval.status == "pending" and approval.requested_args == {"amount": 500}
    assert testkit.CALLS["t_pay"] == []
    assert run.lease_owner == ""


def test_small_amount_needs_no_approval():
    run = advance(script_run([{"calls": [["t_pay", {"amount": 50}]]}, {"text": "ok"}]))
    assert run.status == "succeeded"


def test_stop_max_steps():
    run = advance(
        script_run([{"calls": [["t_echo", {"text": "again"}]], "loop": True}], agent="script-short")
    )
    assert run.status == "failed" and run.stop_reason == "max_steps"
    assert len(steps(run)) <= 6


def test_stop_token_budget():
    run = advance(
        script_run(
            [{"text": "word " * 100, "calls": [["t_echo", {"text": "x"}]], "loop": True}],
            agent="script-budget",
        )
    )
    assert run.status == "failed" and run.stop_reason == "token_budget"


def test_stop_deadline():
    run = script_run([{"text": "hi"}], agent="script-deadline")
    run = advance(run)
    assert run.status == "failed" and run.stop_reason == "deadline"


def test_cancel_requested_is_honoured_at_step_boundary():
    run = script_run([{"calls": [["t_echo", {"text": "x"}]]}, {"text": "never"}])
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    run = advance(run)
    assert run.status == "cancelled" and run.stop_reason == "cancelled"


def test_a_vanished_agent_waits_for_its_deploy_not_a_verdict(monkeypatch):
    run = script_run([{"text": "x"}])
    Run.objects.filter(id=run.id).update(agent="vanished")
    run = advance(run)
    # a worker without the agent's module (issue 19 item 6): queued with the reason, no lease
    assert run.status == "queued" and "unknown agent" in run.error and run.lease_owner == ""
    assert run.enqueued_at > timezone.now()  # its doorbell rings again later


@pytest.mark.django_db(transaction=True)
def test_run_dedupe_under_concurrency():
    def start():
        return start_run("script", {"script": []}, dedupe_key="same-key").run.id

    runs = race(*[start] * 6)
    assert len(set(runs)) == 1, runs
    assert Run.objects.filter(dedupe_key="same-key").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_event_writers_keep_seq_gapless():
    from django.db import transaction

    from agentruns.runtime.store import get_store

    run = script_run([{"text": "x"}])

    def writer():
        for i in range(25):
            with transaction.atomic():
                get_store().append(run.id, [("test.note", {"i": i}), ("test.note", {"i": i})])

    assert race(*[writer] * 4) == [None] * 4
    run.refresh_from_db()
    assert_gapless(run)
    assert RunEvent.objects.filter(run=run, type="test.note").count() == 200


@pytest.mark.django_db(transaction=True)
def test_cancel_during_retry_backoff_is_noticed():
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}]))
    step = steps(run)[1]
    approval_services.approve(Approval.objects.get(step=step).id, user=None)
    Step.objects.filter(id=step.id).update(
        status="pending", next_attempt_at=timezone.now() + timedelta(seconds=60)
    )
    Run.objects.filter(id=run.id).update(status="queued")

    def cancel_later():
        Run.objects.filter(id=run.id).update(cancel_requested=True)
        connection.close()

    timer = threading.Timer(0.5, cancel_later)
    timer.start()
    started = timezone.now()
    run = advance(run)
    timer.join()
    connection.close()
    assert run.status == "cancelled"
    assert (timezone.now() - started).total_seconds() < 30  # not the whole 60 s backoff
    assert testkit.CALLS["t_pay"] == []


@pytest.mark.django_db(transaction=True)
def test_cancel_arriving_while_parking_cancels_the_parked_run(monkeypatch):
    from agentruns.runtime.inbox import inbox  # where the executor calls it: the inbox port

    original = inbox().open_approval

    def open_and_get_cancelled(step, agent):
        approval = original(step, agent)
        Run.objects.filter(id=step.run_id).update(cancel_requested=True)  # a cancel lands now
        return approval

    monkeypatch.setattr(inbox(), "open_approval", open_and_get_cancelled)
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}]))
    assert run.status == "cancelled"
    assert Approval.objects.get(step=steps(run)[1]).status != "pending"


def test_manual_retry_gets_a_fresh_automatic_retry_budget():
    from agentruns.services import retry_run

    testkit.FAILS["t_charge"] = 5  # 3 attempts fail the run, then 2 more failures after retry
    run = advance(script_run([{"calls": [["t_charge", {"amount": 3}]]}, {"text": "ok"}]))
    assert run.status == "failed"
    retry_run(run.id)
    run = advance(run)
    assert run.status == "succeeded", run.error
    step = steps(run)[1]
    assert step.attempts == 6 and step.retry_base == 3
    assert {key for key, _, _ in testkit.CALLS["t_charge"]} == {step.idempotency_key}


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_its_lease_writes_nothing():
    """The fenced one-round-trip commit: a lease taken over mid-step aborts the whole commit."""
    from agentruns.runtime.engine import journal
    from agentruns.runtime.engine.lanes import CallerLane
    from agentruns.runtime.engine.slice import SliceState
    from agentruns.runtime.events import LeaseLost
    from agentruns.runtime.store.rows import WriteBatch

    run = script_run([{"text": "x"}])
    executor = RunExecutor(run.id)
    assert executor.claim()
    Run.objects.filter(id=run.id).update(lease_owner="someone-else")  # the lease moved on
    stray = Step(
        run_id=run.id, index=0, kind="model", idempotency_key="stray-key", status="running"
    )
    before = RunEvent.objects.filter(run=run).count()
    with pytest.raises(LeaseLost):
        fence = SliceState(run_id=run.id, owner=executor.owner, ttl=30, lane=CallerLane())
        journal.commit(fence, [("step.started", {"step": 0})], batch=WriteBatch().insert([stray]))
    assert not Step.objects.filter(run=run).exists()
    assert RunEvent.objects.filter(run=run).count() == before


def test_stop_per_agent_cost_budget(settings):
    settings.AGENTRUNS_MODEL_PRICES = "scripted=100000/100000"  # $0.10 per token
    run = advance(
        script_run(
            [{"text": "word " * 20, "calls": [["t_echo", {"text": "x"}]], "loop": True}],
            agent="script-cost",
        )
    )
    assert run.status == "failed" and run.stop_reason == "cost_budget"
    assert run.cost_usd >= 0.5


def test_cancel_read_with_the_commit_that_began_a_side_effect_call(monkeypatch):
    """The "before" commit of a side-effect call (its "running + attempt" rows) reads a cancel
    that just landed: the call is never made, and nothing is left running."""
    from agentruns.runtime.engine.tools import unit as tool_unit

    original = tool_unit._begin

    def cancel_lands_first(state, *args, **kwargs):
        Run.objects.filter(id=state.run.id).update(cancel_requested=True)
        return original(state, *args, **kwargs)

    monkeypatch.setattr(tool_unit, "_begin", cancel_lands_first)
    turns = [{"calls": [["t_pay", {"amount": 50}], ["t_echo", {"text": "x"}]]}, {"text": "paid"}]
    run = advance(script_run(turns))
    assert run.status == "cancelled"
    assert testkit.CALLS["t_pay"] == [] and testkit.CALLS["t_echo"] == []
    pay, echo = steps(run, "tool")
    assert echo.status == "skipped"  # planned, never run: as an idle run's cancel leaves it
    assert pay.status == "failed" and "before the call was made" in pay.error
    attempt = pay.attempt_rows.get()
    assert attempt.outcome == "failed" and attempt.finished_at is not None
    assert [e.data["step"] for e in events(run, "step.failed")] == [pay.index]
    assert_gapless(run)


def test_a_cancel_at_a_step_boundary_withdraws_the_runs_inbox_items():
    """A run that reaches the executor with a step still waiting for a decision (its item in
    the inbox) and a cancel requested: the item is withdrawn, as an idle run's cancel does."""
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "ok"}]))
    approval = Approval.objects.get(step=steps(run)[1])
    assert approval.status == "pending"
    Run.objects.filter(id=run.id).update(status="queued", cancel_requested=True)
    run = advance(run)
    assert run.status == "cancelled"
    approval.refresh_from_db()
    assert approval.status == "resolved" and approval.resolution == "withdrawn"
    assert steps(run)[1].status == "skipped"
    assert [e.data["approval"] for e in events(run, "approval.withdrawn")] == [approval.id]
    assert testkit.CALLS["t_pay"] == []
    assert_gapless(run)
