"""The run pool of a worker process, in this process with real threads and PostgreSQL: many
runs at once and never more than its capacity, backpressure, the drain (hand-over at a step
boundary, leases released after the grace period), backoffs and parking that free the slot,
connections lent back while the model keeps a run waiting, the lease keeper's one statement.

Real worker processes (qcluster, SIGKILL, SIGTERM, recycling): tests/crash/test_many_in_flight.py.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import (
    AttemptOutcome,
    Run,
    RunEvent,
    RunStatus,
    Step,
    StepAttempt,
    StepStatus,
    WorkerHeartbeat,
)
from agentruns.runtime.dispatch.broker import DoorbellBroker
from agentruns.runtime.dispatch.lease import Heartbeat, renew
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.workers.pool import RunPool
from agentruns.services import start_run
from tests import testkit
from tests.helpers import advance, assert_gapless, events
from tests.procs import wait_until
from tests.runtime import poolkit

pytestmark = pytest.mark.django_db(transaction=True)  # pool threads have their own connections


def script(*turns: dict, agent: str = "script") -> Run:
    return start_run(agent, {"script": list(turns)}, enqueue_task=False).run


def charge_run() -> Run:
    """A run whose first tool call (t_charge) blocks until testkit.GATE opens."""
    return script({"text": "charging", "calls": [["t_charge", {"amount": 5}]]})


def status_counts(runs: list[Run]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Run.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


def doorbells() -> int:
    return OrmQ.objects.count()


@pytest.fixture
def pool():
    made: list[RunPool] = []

    def make(capacity: int) -> RunPool:
        made.append(RunPool(capacity, name=f"pool@test:{len(made)}", supervise=False))
        return made[-1]

    yield make
    DoorbellBroker.stop_listening()  # an empty dequeue listens for doorbells: let go of it
    testkit.GATE.set()
    for each in made:  # nothing may still write when the tables are flushed
        wait_until(lambda p=each: p.in_flight == 0, timeout=30, message="pool threads to finish")


def test_many_runs_at_once_never_more_than_capacity(pool):
    testkit.GATE.clear()
    runs = [charge_run() for _ in range(6)]
    p = pool(4)
    outcomes = [p.hand_over(str(r.id), wait=0) for r in runs]
    # four slots: four runs taken, the rest given back to the broker at once (nobody waited)
    assert outcomes == ["started"] * 4 + ["requeued"] * 2
    assert doorbells() == 2
    wait_until(lambda: len(testkit.CALLS["t_charge"]) == 4, timeout=30, message="4 calls in flight")
    assert status_counts(runs) == {RunStatus.RUNNING: 4, RunStatus.QUEUED: 2}
    assert p.in_flight == 4
    testkit.GATE.set()
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the runs to finish")
    assert status_counts(runs) == {RunStatus.SUCCEEDED: 4, RunStatus.QUEUED: 2}


def test_a_full_pool_makes_the_hand_over_wait_for_a_slot(pool):
    testkit.GATE.clear()
    first, second = charge_run(), charge_run()
    p = pool(1)
    assert p.hand_over(str(first.id), wait=0) == "started"
    result: list[str] = []
    waiter = threading.Thread(target=lambda: result.append(p.hand_over(str(second.id), wait=60)))
    waiter.start()
    wait_until(lambda: len(testkit.CALLS["t_charge"]) == 1, timeout=30, message="first call")
    # the hand-over blocks (backpressure: this q2 worker takes no other task meanwhile)
    assert result == [] and waiter.is_alive()
    assert Run.objects.get(id=second.id).status == RunStatus.QUEUED
    testkit.GATE.set()
    waiter.join(60)
    assert result == ["started"]
    wait_until(lambda: p.in_flight == 0, timeout=30, message="both runs to finish")
    assert status_counts([first, second]) == {RunStatus.SUCCEEDED: 2}
    assert doorbells() == 0  # nothing was given back


def test_a_full_pools_hand_over_waits_at_most_a_quarter_of_q2s_timeout(pool, settings):
    """A q2 task that outlived q2's `timeout` would have its process killed, runs in flight and
    all: the configured wait is cut to a quarter of it, then the doorbell goes back."""
    settings.AGENTRUNS_HANDOVER_WAIT_SECONDS = 60
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 4}
    testkit.GATE.clear()
    first, second = charge_run(), charge_run()
    p = pool(1)
    assert p.hand_over(str(first.id), wait=0) == "started"
    began = time.monotonic()
    assert p.hand_over(str(second.id)) == "requeued"  # the configured wait, as q2's task asks
    waited = time.monotonic() - began
    assert 0.9 <= waited < 30, waited  # 4 s / 4, not the configured 60 s
    assert doorbells() == 1 and Run.objects.get(id=second.id).status == RunStatus.QUEUED


def two_runs_held_in_a_charge(pool) -> tuple[Any, list[Run]]:
    """A pool of two running two runs, each held inside its first tool call (a charge)
    until the test sets testkit.GATE; then each asks the model once more (an echo)."""
    testkit.GATE.clear()
    runs = [
        script(
            {"text": "charging", "calls": [["t_charge", {"amount": 5}]]},
            {"text": "echo", "calls": [["t_echo", {"text": "after"}]]},
        )
        for _ in range(2)
    ]
    p = pool(2)
    for run in runs:
        assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(lambda: len(testkit.CALLS["t_charge"]) == 2, timeout=30, message="calls in flight")
    return p, runs


def test_drain_hands_runs_over_at_the_next_step_boundary(pool):
    p, runs = two_runs_held_in_a_charge(pool)
    stopping = threading.Thread(target=p.stop, kwargs={"grace": 60})
    stopping.start()
    wait_until(lambda: p.drain.is_set(), timeout=10, message="the drain to start")
    # a draining pool takes no new run: the doorbell goes back to the broker
    late = charge_run()
    assert p.hand_over(str(late.id), wait=30) == "requeued"
    testkit.GATE.set()  # the calls in flight finish within the grace period
    stopping.join(60)
    assert p.drained.is_set() and p.in_flight == 0
    for run in runs:
        run.refresh_from_db()
        # the step finished here, then the run went back to the queue, lease released, rung
        assert run.status == RunStatus.QUEUED and run.lease_owner == ""
        charge = Step.objects.get(run=run, tool="t_charge")
        assert charge.status == StepStatus.SUCCEEDED and charge.attempts == 1
        reasons = [e.data.get("reason") for e in events(run, "run.status")]
        assert reasons[-1] == "worker draining"
    assert doorbells() == 3  # the two handed over + the late one
    # another worker continues them where they stopped
    for run in runs:
        advance(run)
        assert run.status == RunStatus.SUCCEEDED
        assert Step.objects.filter(run=run, tool="t_echo", status=StepStatus.SUCCEEDED).exists()
        assert_gapless(run)
    assert not StepAttempt.objects.filter(outcome=AttemptOutcome.CRASHED).exists()


def test_a_recycle_lets_the_runs_in_flight_finish_here(pool):
    p, runs = two_runs_held_in_a_charge(pool)
    stopping = threading.Thread(target=p.stop, kwargs={"grace": 60, "finish_first": True})
    stopping.start()
    wait_until(lambda: p.closing.is_set(), timeout=10, message="the stop to start")
    assert p.hand_over(str(charge_run().id), wait=30) == "requeued"  # no new runs
    assert not p.drain.is_set()
    testkit.GATE.set()
    stopping.join(60)
    # nothing was handed over: both runs finished in the stopping process
    assert status_counts(runs) == {RunStatus.SUCCEEDED: 2}
    assert not RunEvent.objects.filter(data__reason="worker draining").exists()


def test_drain_releases_the_lease_of_a_step_past_the_grace_period(pool):
    testkit.GATE.clear()
    run = charge_run()
    p = pool(1)
    assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(lambda: len(testkit.CALLS["t_charge"]) == 1, timeout=30, message="call in flight")
    assert p.stop(grace=0.2) == 1
    run.refresh_from_db()
    # still running (its step is mid-call), but nobody's lease: the next worker takes it now
    assert run.status == RunStatus.RUNNING and run.lease_owner == ""
    assert run.lease_expires_at is None and doorbells() == 1
    testkit.GATE.set()
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the cut executor to stop")
    # its late result was fenced off: the step is still running, for recovery by its class
    assert Step.objects.get(run=run, tool="t_charge").status == StepStatus.RUNNING
    advance(run)
    assert run.status == RunStatus.SUCCEEDED
    keys = {key for key, _, _ in testkit.CALLS["t_charge"]}
    assert len(testkit.CALLS["t_charge"]) == 2 and len(keys) == 1  # re-run with the same key
    charge = Step.objects.get(run=run, tool="t_charge")
    outcomes = list(charge.attempt_rows.order_by("number").values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.CRASHED, AttemptOutcome.SUCCEEDED]
    assert_gapless(run)


def test_a_long_retry_backoff_frees_the_slot_and_rings_when_due(pool):
    run = script({"text": "flaky", "calls": [["t_flaky_slow", {}]]}, agent="pool-script")
    other = script({"text": "echo", "calls": [["t_echo", {"text": "x"}]]})
    p = pool(1)
    before = timezone.now()
    assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the run to back off")
    run.refresh_from_db()
    flaky = Step.objects.get(run=run, tool="t_flaky_slow")
    due = flaky.next_attempt_at
    assert due >= before + timedelta(seconds=poolkit.LONG_BACKOFF_SECONDS - 1)
    # queued with no lease and no thread; its doorbell is due with the retry
    assert run.status == RunStatus.QUEUED and run.lease_owner == ""
    assert run.enqueued_at == due
    ring = OrmQ.objects.get()
    assert ring.lock == due
    assert DoorbellBroker(list_key=ring.key).dequeue() is None  # not before it is due
    assert events(run, "run.status")[-1].data["reason"] == "retry backoff"
    # the one slot serves another run meanwhile
    assert p.hand_over(str(other.id), wait=0) == "started"
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the other run")
    assert Run.objects.get(id=other.id).status == RunStatus.SUCCEEDED
    # when due (the doorbell's, the run's and the step's due times brought to now), the
    # doorbell is pulled and the retry runs
    OrmQ.objects.update(lock=timezone.now() - timedelta(seconds=1))
    Run.objects.filter(id=run.id).update(enqueued_at=timezone.now())
    Step.objects.filter(id=flaky.id).update(next_attempt_at=timezone.now())
    assert [pk for pk, _ in DoorbellBroker(list_key=ring.key).dequeue()] == [ring.pk]
    assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the retry")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert Step.objects.get(id=flaky.id).attempts == 2
    assert_gapless(run)


def test_a_parked_run_holds_no_slot(pool, settings):
    run = script({"text": "pay", "calls": [["t_pay", {"amount": 500}]]})  # needs approval
    p = pool(1)
    assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the run to park")
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.lease_owner == ""


def test_runs_waiting_on_the_model_hold_no_connection(pool, settings):
    # a long model turn: the window in which no run may hold a connection (room for a busy machine)
    settings.SCRIPTED_MODEL_LATENCY_MS = 6000
    db_pool = connections["default"].pool
    assert db_pool is not None, "the test settings use the psycopg pool"
    runs = [script({"text": "hello"}) for _ in range(20)]  # twice the pool's size

    def lent() -> int:
        stats = db_pool.get_stats()
        return stats["pool_size"] - stats["pool_available"]

    connection.close()  # this thread's own connection back to the pool too
    # connections other threads of this test process still hold (an earlier test's thread that
    # ended without closing its connection): not this test's pool or runs
    before = lent()
    p = pool(20)
    for run in runs:
        assert p.hand_over(str(run.id), wait=0) == "started"
    wait_until(
        lambda: Run.objects.filter(status=RunStatus.RUNNING).count() == 20,
        timeout=30,
        message="20 runs waiting on the model",
    )
    connection.close()

    # 20 runs in flight, each in the middle of a model turn: none of them holds a connection
    wait_until(lambda: lent() <= before, timeout=5, interval=0.02, message="connections back")
    stats = db_pool.get_stats()
    assert Run.objects.filter(status=RunStatus.RUNNING).count() == 20  # still mid-turn
    assert stats["pool_size"] <= stats["pool_max"] < 20
    wait_until(lambda: p.in_flight == 0, timeout=60, message="the runs to finish")
    assert status_counts(runs) == {RunStatus.SUCCEEDED: 20}


def test_the_keeper_renews_every_due_lease_in_one_statement_and_flags_a_taken_one():
    runs = [script() for _ in range(3)]
    soon = timezone.now() + timedelta(seconds=1)
    beats = []
    for i, run in enumerate(runs):
        Run.objects.filter(id=run.id).update(
            status=RunStatus.RUNNING, lease_owner=f"me:1:{i}", lease_expires_at=soon
        )
        beats.append(Heartbeat(run.id, f"me:1:{i}", ttl=30))
    Run.objects.filter(id=runs[1].id).update(lease_owner="thief:2:x")
    with CaptureQueriesContext(connection) as queries:
        lost = renew(beats)
    assert len(queries.captured_queries) == 1
    assert lost == [beats[1]]
    for run, owner in ((runs[0], "me:1:0"), (runs[2], "me:1:2")):
        row = Run.objects.get(id=run.id)
        assert row.lease_owner == owner and row.lease_expires_at > soon + timedelta(seconds=20)
    assert Run.objects.get(id=runs[1].id).lease_expires_at == soon  # not ours: untouched


def test_the_pools_heartbeat_is_one_statement_that_inserts_then_updates_its_row(pool):
    """/healthz and /metrics read this row; the beat runs about once a second per process."""
    p = pool(3)
    WorkerHeartbeat.objects.create(worker="qcluster@other", last_seen_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        p._beat()
    assert len(queries.captured_queries) == 1
    first = WorkerHeartbeat.objects.get(worker=p.name)
    assert (first.runs_in_flight, first.run_capacity, first.draining) == (0, 3, False)
    assert first.process_health["database"]["up"] is True
    p.closing.set()
    with CaptureQueriesContext(connection) as queries:
        p._beat()
    assert len(queries.captured_queries) == 1
    again = WorkerHeartbeat.objects.get(worker=p.name)
    assert again.pk == first.pk and again.draining and again.last_seen_at > first.last_seen_at
    assert WorkerHeartbeat.objects.get(worker="qcluster@other").last_sweep_at is None


def test_the_broker_hands_out_the_oldest_doorbell_first():
    runs = [script() for _ in range(5)]
    for run in runs:
        enqueue(run.id)
    rows = list(OrmQ.objects.order_by("id"))
    # the table's physical order need not be the queue's: shuffle it with updates
    for row in reversed(rows):
        OrmQ.objects.filter(id=row.id).update(payload=row.payload)
    broker = DoorbellBroker(list_key=rows[0].key)
    taken = [broker.dequeue()[0][0] for _ in rows]
    assert taken == [r.id for r in rows]


def test_a_hand_over_takes_the_doorbells_behind_it_and_leaves_other_tasks(pool):
    from django_q.tasks import async_task

    from agentruns.runtime.dispatch.queue import ADVANCE_TASK

    runs = [script() for _ in range(3)]
    enqueue(runs[0].id)
    async_task("math.floor", 1.5)  # somebody else's task in the same queue
    for run in runs[1:]:
        enqueue(run.id)
    broker = DoorbellBroker(list_key=OrmQ.objects.first().key)
    taken = broker.take(10, ADVANCE_TASK)
    assert [args[0] for _, args in taken] == [str(r.id) for r in runs]  # oldest first
    broker.acknowledge_all([ack for ack, _ in taken])
    # the other task went straight back: q2's pusher gets it as if nothing had happened
    (left,) = broker.dequeue()
    assert left[0] == OrmQ.objects.get().id
    # a pool with room takes the waiting doorbells along with the one q2 gave it
    OrmQ.objects.all().delete()
    more = [script({"text": "hi"}) for _ in range(3)]
    for run in more:
        enqueue(run.id)
    p = pool(2)
    assert p.hand_over(str(runs[0].id), wait=0) == "started"
    assert p.take_waiting() == 1  # one slot left: one doorbell taken, two stay for others
    assert OrmQ.objects.count() == 2
    wait_until(lambda: p.in_flight == 0, timeout=30, message="the runs")
    assert Run.objects.get(id=more[0].id).status == RunStatus.SUCCEEDED
