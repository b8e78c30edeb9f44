"""Many runs in flight per worker process (issue 12), with real processes against PostgreSQL:
a real `qcluster`, a real daphne serving the refund gateway, SIGKILL of the whole cluster at
random moments, SIGTERM of its main process with a second cluster taking over, q2 recycling its
worker processes under load, and a one-slot worker that parks and backs off runs. Every
assertion is on the outside world: the gateway's ledger, the outbox, the database rows.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from collections import Counter
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.db.models import Count
from django.utils import timezone

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
from agentruns.services import start_run
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from approvals.services import approve
from support.models import GatewayRefund, Order, OutboxMessage, TicketNote
from tests.crash import kit
from tests.crash.kit import assert_refunded_exactly_once
from tests.helpers import assert_gapless
from tests.procs import Proc, module_web, wait_until
from tests.runtime import poolkit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

GATEWAY_DELAY_MS = 800  # slow enough that a drain's grace period cuts some refunds mid-call
HOST = socket.gethostname()


# ------------------------------------------------------------------ processes
@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker):
    """One daphne for the module: the refund gateway every worker calls, and /healthz."""
    with module_web(
        tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=GATEWAY_DELAY_MS
    ) as url:
        yield url


@pytest.fixture
def seeded(transactional_db):
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=100, stdout=devnull)


worker = kit.worker  # (a qcluster calling the gateway; base_env: no model delay)


def cluster_up(proc: Proc) -> None:
    """The qcluster's sweeper loop beats once q2 runs (its row is named after the main pid)."""
    wait_until(
        lambda: WorkerHeartbeat.objects.filter(worker=f"qcluster@{HOST}:{proc.popen.pid}").exists(),
        timeout=60,
        message=f"{proc.log_path.name} to start",
    )


# ------------------------------------------------------------------ runs and checks
def start_refunds(count: int, spaced: float = 0) -> dict[str, tuple[Run, int]]:
    """One refund run per order ORD-1001...; order_id -> (run, the amount it must refund).
    `spaced`: seconds between starts (each doorbell then reaches a worker as its own q2 task)."""
    started = {}
    for n in range(1001, 1001 + count):
        time.sleep(spaced)
        order = Order.objects.get(order_id=f"ORD-{n}")
        run = start_run(
            "refund", {"order_id": order.order_id, "message": "It arrived broken, refund it."}
        ).run
        started[order.order_id] = (run, order.amount_cents)
    return started


def running() -> int:
    return Run.objects.filter(status=RunStatus.RUNNING).count()


def in_flight() -> int:
    """Runs a live worker executes (a killed worker's runs stay `running` until re-leased)."""
    return Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__gt=timezone.now()).count()


def assert_each_effect_once(gateway: str, runs: dict[str, tuple[Run, int]]) -> set:
    """Every run ended; no refund twice, no reply twice, no note twice; a run may only wait on a
    reply that a kill cut mid-call (reconciliation). Returns the ids of the waiting runs."""
    waiting = set()
    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        assert run.status in (RunStatus.SUCCEEDED, RunStatus.WAITING), (order_id, run.error)
        # the refund precedes the reply: it happened exactly once either way
        assert_refunded_exactly_once(gateway, order_id, amount, run)
        replies = OutboxMessage.objects.filter(run_id=run.id).count()
        if run.status == RunStatus.WAITING:
            waiting.add(run.id)
            reply = Step.objects.get(run=run, tool="send_customer_reply")
            assert reply.status == StepStatus.UNKNOWN, (order_id, reply.status)
            item = Approval.objects.get(step=reply)
            assert item.kind == ApprovalKind.RECONCILIATION
            assert item.status == ApprovalStatus.PENDING
            assert replies <= 1
        else:
            assert replies == 1, order_id
            assert TicketNote.objects.filter(ticket__order__order_id=order_id).count() == 1
        assert_gapless(run)
    ids = [r.id for r, _ in runs.values()]
    twice = (
        StepAttempt.objects.filter(step__run_id__in=ids, outcome=AttemptOutcome.SUCCEEDED)
        .values("step_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not twice.exists(), "a step that succeeded was executed again"
    return waiting


def processes_of(proc_owners: set[str]) -> set[str]:
    return {owner.rsplit(":", 1)[0] for owner in proc_owners}


# ------------------------------------------------------------------ the tests
def test_a_hundred_runs_in_flight_each_refund_exactly_once(tmp_path, procs, gateway, seeded):
    per_process, q_workers = 40, 2
    # the backlog first, then the worker: started one by one against a live worker, the 100
    # starts took longer on a loaded machine than the first runs did, so 80 were never in
    # flight at once however many slots there were
    runs = start_refunds(100)
    ids = [r.id for r, _ in runs.values()]
    w = worker(
        tmp_path,
        procs,
        gateway,
        "worker-100",
        Q_WORKERS=q_workers,
        AGENTRUNS_RUNS_PER_PROCESS=per_process,
        SCRIPTED_MODEL_LATENCY_MS=1000,
    )
    capacity = per_process * q_workers
    peak, reported = 0, []
    deadline = time.monotonic() + 150
    while Run.objects.filter(id__in=ids, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).exists():
        assert time.monotonic() < deadline, w.log()
        now_running = running()
        peak = max(peak, now_running)
        if now_running == capacity and not any(r["runs_in_flight"] == capacity for r in reported):
            reported.append(httpx.get(gateway + "/healthz", timeout=10).json()["checks"]["worker"])
        time.sleep(0.05)
    # the configured concurrency was really reached, and never exceeded (100 runs, 80 slots)
    assert peak == capacity
    # and reported by /healthz: both worker processes, their capacity and runs in flight
    full = [r for r in reported if r["runs_in_flight"] == capacity]
    assert full, reported
    assert full[0]["run_capacity"] == capacity and len(full[0]["processes"]) == q_workers
    assert [p["runs_in_flight"] for p in full[0]["processes"]] == [per_process] * q_workers
    waiting = assert_each_effect_once(gateway, runs)
    assert not waiting  # nothing was killed: every run succeeded
    assert GatewayRefund.objects.count() == 100
    assert not StepAttempt.objects.exclude(outcome=AttemptOutcome.SUCCEEDED).exists()


def test_sigkill_with_dozens_in_flight_at_random_moments(tmp_path, procs, gateway, seeded):
    seed = int(os.environ.get("CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print(f"\n[many-in-flight] random seed {seed} (set CRASH_SEED to replay)")
    env = {"AGENTRUNS_RUNS_PER_PROCESS": 20, "SCRIPTED_MODEL_LATENCY_MS": 400}
    runs = start_refunds(40)
    ids = [r.id for r, _ in runs.values()]
    workers, killed_with = [], []
    for round_no in range(3):
        w = worker(tmp_path, procs, gateway, f"worker-kill{round_no}", **env)
        workers.append(w)
        since = timezone.now()
        # this cluster at work: dozens of runs under its live leases, steps started by it
        wait_until(
            lambda since=since: (
                in_flight() >= 15
                and StepAttempt.objects.filter(step__run_id__in=ids, started_at__gt=since).exists()
            ),
            timeout=90,
            interval=0.05,
            message="dozens of runs in flight",
        )
        time.sleep(rng.uniform(0.1, 1.5))  # the random moment (not a correctness condition)
        in_flight_now = in_flight()
        cut = StepAttempt.objects.filter(
            step__run_id__in=ids, started_at__gt=since, finished_at__isnull=True
        ).count()
        w.kill()  # SIGKILL of the whole process group
        killed_with.append(in_flight_now)
        print(
            f"[many-in-flight] round {round_no}: SIGKILL with {in_flight_now} runs in flight, "
            f"{cut} step attempts cut mid-step"
        )
    workers.append(worker(tmp_path, procs, gateway, "worker-final", **env))
    kit.wait_settled(ids, workers)
    assert max(killed_with) >= 12, killed_with  # dozens in flight when it died
    waiting = assert_each_effect_once(gateway, runs)
    crashed = StepAttempt.objects.filter(
        step__run_id__in=ids, outcome=AttemptOutcome.CRASHED
    ).count()
    print(
        f"[many-in-flight] {len(runs)} runs: {len(runs) - len(waiting)} succeeded, "
        f"{len(waiting)} wait on a reconciliation; {crashed} attempts cut by the kills"
    )


def test_sigterm_drains_and_a_second_worker_continues_at_once(tmp_path, procs, gateway, seeded):
    # a lease TTL far longer than the test: a lease left behind would stall its run visibly
    env = {
        "AGENTRUNS_LEASE_TTL_SECONDS": 120,
        # model turns and refund calls end within it even on a loaded machine (at 3 s a starved
        # CI machine cut refund calls), t_slow (60 s) not
        "AGENTRUNS_DRAIN_SECONDS": 10,
        # room for all 28 in either process: a q2 worker that is full waits with the task q2's
        # pusher gave it until a slot frees (backpressure), and that run would then start only
        # after a refund ended, so whether all 28 ran at once depended on the pusher's timing
        "AGENTRUNS_RUNS_PER_PROCESS": 28,
        "SCRIPTED_MODEL_LATENCY_MS": 1000,
        "AGENTRUNS_AGENT_MODULES": "tests.testkit,tests.runtime.poolkit",
    }
    # the second cluster comes up first and is frozen (SIGSTOP) so that all 28 runs go to the
    # first cluster; it wakes just before the first is stopped. (Started after
    # the runs, as it once was, it could take so long to come up on a loaded machine that the
    # refund runs had ended before the SIGTERM and there was nothing left to hand over.)
    second = worker(tmp_path, procs, gateway, "worker-b", **env)
    cluster_up(second)
    os.killpg(second.popen.pid, signal.SIGSTOP)
    first = worker(tmp_path, procs, gateway, "worker-a", **env)
    runs = start_refunds(24)
    slow = [
        start_run("pool-script", {"script": [{"text": "slow", "calls": [["t_slow", {}]]}]}).run
        for _ in range(4)
    ]
    ids = [r.id for r, _ in runs.values()] + [r.id for r in slow]
    try:
        wait_until(lambda: running() == 28, timeout=90, interval=0.05, message="runs in flight")
    except TimeoutError:
        statuses = Counter(Run.objects.filter(id__in=ids).values_list("status", flat=True))
        raise AssertionError(f"not all 28 in flight: {statuses}\n{first.log()}") from None
    wait_until(
        lambda: (
            StepAttempt.objects.filter(step__tool="issue_refund").exists()
            and StepAttempt.objects.filter(step__tool="t_slow").count() == 4
        ),
        timeout=60,
        message="refund calls and the slow calls",
    )
    held = set(Run.objects.filter(status=RunStatus.RUNNING).values_list("lease_owner", flat=True))
    first_processes = processes_of(held)
    refund_ids = [r.id for r, _ in runs.values()]
    assert Run.objects.filter(id__in=refund_ids, status=RunStatus.RUNNING).exists()
    os.killpg(second.popen.pid, signal.SIGCONT)
    sent_at = timezone.now()
    os.kill(first.popen.pid, signal.SIGTERM)  # the main pid only, as systemd/k8s/honcho do
    assert first.popen.wait(timeout=60) == 0, first.log()
    stopped_at = timezone.now()
    # gone, and nothing of it left behind: no lease of its processes, no pool heartbeat
    leftover = [
        owner
        for owner in Run.objects.filter(
            status__in=[RunStatus.QUEUED, RunStatus.RUNNING], lease_expires_at__gt=stopped_at
        ).values_list("lease_owner", flat=True)
        if owner.rsplit(":", 1)[0] in first_processes
    ]
    assert not leftover, leftover
    assert not WorkerHeartbeat.objects.filter(
        worker__in=[f"pool@{p}" for p in first_processes]
    ).exists()
    # the second worker continues all of them well within the lease TTL (120 s)
    kit.wait_settled(ids, [second], timeout=90)
    later = StepAttempt.objects.filter(step__run_id__in=ids, started_at__gt=sent_at)
    assert {a.rsplit(":", 1)[0] for a in later.values_list("worker", flat=True)} - first_processes
    # refund runs: their steps ended within the grace period and they were handed over between
    # two steps; nothing was cut, each effect happened once
    assert_each_effect_once(gateway, runs)
    assert (
        not StepAttempt.objects.filter(step__run_id__in=refund_ids)
        .exclude(outcome=AttemptOutcome.SUCCEEDED)
        .exists()
    )
    assert RunEvent.objects.filter(
        run_id__in=refund_ids, type="run.status", data__reason="worker draining"
    ).exists()
    # the calls still running when the grace ran out: leases released, re-run elsewhere with the
    # same key (idempotency="key"), attempt 1 recorded as cut
    for run in slow:
        assert Run.objects.get(id=run.id).status == RunStatus.SUCCEEDED
        step = Step.objects.get(run=run, tool="t_slow")
        assert list(step.attempt_rows.order_by("number").values_list("outcome", flat=True)) == [
            AttemptOutcome.CRASHED,
            AttemptOutcome.SUCCEEDED,
        ]
        assert step.result["key"] == step.idempotency_key and step.result["attempt"] == 2
        assert_gapless(run)


def test_q2_recycling_never_kills_runs_in_flight(tmp_path, procs, gateway, seeded, settings):
    # q2 counts its tasks: starts ring a q2 doorbell each here (claimed starts are no q2 task,
    # so a process fed by its claimer is recycled only by the doorbells it still gets)
    settings.AGENTRUNS_RUN_CLAIM_BATCH = 0
    w = worker(
        tmp_path,
        procs,
        gateway,
        "worker-recycle",
        AGENTRUNS_RUN_CLAIM_BATCH=0,
        Q_RECYCLE=4,  # a worker process ends after 4 q2 tasks, with those runs in flight
        AGENTRUNS_RUNS_PER_PROCESS=20,
        AGENTRUNS_DRAIN_SECONDS=30,
        SCRIPTED_MODEL_LATENCY_MS=300,
    )
    cluster_up(w)
    # one start at a time: a burst would be taken along by one hand-over (one q2 task)
    runs = start_refunds(24, spaced=0.15)
    ids = [r.id for r, _ in runs.values()]
    kit.wait_settled(ids, [w])
    waiting = assert_each_effect_once(gateway, runs)
    assert not waiting
    # recycled for real: the runs' steps ran in many successive worker processes...
    processes = {
        a.rsplit(":", 1)[0]
        for a in StepAttempt.objects.filter(step__run_id__in=ids).values_list("worker", flat=True)
    }
    assert len(processes) > 2, processes
    # ...and no step was cut by it: every attempt succeeded
    assert (
        not StepAttempt.objects.filter(step__run_id__in=ids)
        .exclude(outcome=AttemptOutcome.SUCCEEDED)
        .exists()
    )


def test_parked_and_backing_off_runs_hold_no_slot(
    tmp_path, procs, gateway, seeded, django_user_model
):
    # one worker process with one slot: anything holding it would stall the others
    w = worker(
        tmp_path,
        procs,
        gateway,
        "worker-one-slot",
        Q_WORKERS=1,
        AGENTRUNS_RUNS_PER_PROCESS=1,
        AGENTRUNS_AGENT_MODULES="tests.testkit,tests.runtime.poolkit",
    )

    def script_run(*calls: list) -> Run:
        turns = [{"text": "go", "calls": [list(c) for c in calls]}]
        return start_run("pool-script", {"script": turns}).run

    parked = script_run(("t_pay", {"amount": 500}))  # needs an approval
    backing_off = script_run(("t_flaky", {}))  # fails once, retry due 3 s later
    plain = script_run(("t_echo", {"text": "hi"}))
    wait_until(
        lambda: Run.objects.get(id=plain.id).status == RunStatus.SUCCEEDED,
        timeout=60,
        message="the plain run to finish",
    )
    backing_off.refresh_from_db()
    parked.refresh_from_db()
    assert parked.status == RunStatus.WAITING
    kit.wait_settled([backing_off.id], [w], timeout=60)
    plain.refresh_from_db()
    flaky = Step.objects.get(run=backing_off, tool="t_flaky")
    first, second = flaky.attempt_rows.order_by("number")
    # the one slot ran `plain` while `backing_off` waited for its retry, then the retry ran
    assert plain.finished_at < second.started_at
    assert second.started_at - first.finished_at >= timedelta(
        seconds=poolkit.SHORT_BACKOFF_SECONDS - 0.1
    )
    assert Run.objects.get(id=backing_off.id).status == RunStatus.SUCCEEDED
    assert RunEvent.objects.filter(
        run=backing_off, type="run.status", data__reason="retry backoff"
    ).exists()
    # the parked run held nothing either: approved, it finishes on the same single slot
    lead = django_user_model.objects.get(username="lead")  # the seeded superuser
    approve(Approval.objects.get(run=parked).id, user=lead)
    kit.wait_settled([parked.id], [w], timeout=60)
    assert Run.objects.get(id=parked.id).status == RunStatus.SUCCEEDED
