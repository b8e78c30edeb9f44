"""A real qcluster SIGKILLed as a whole (its process group) at random moments, several times, with
refunds in flight against the real gateway: every run ends, each refund once by the gateway's
ledger, each reply once or sent to reconciliation. Run with `-s` to see the measured gaps.
"""

from __future__ import annotations

import os
import random
import time
from datetime import datetime

import pytest
from django.utils import timezone

from agentruns.models import (
    AttemptOutcome,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepStatus,
    WorkerHeartbeat,
)
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from support.models import GatewayRefund, OutboxMessage, TicketNote
from tests.crash.kit import (
    SETTLED,
    assert_refunded_exactly_once,
    attempt_outcomes,
    record_gap,
    start_refunds,
    wait_settled,
    worker,
)
from tests.helpers import assert_gapless
from tests.procs import Proc, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]


# ------------------------------------------------------------------ SIGKILL of the whole worker
def test_sigkill_whole_worker_at_random_moments(tmp_path, procs, seeded):
    seed = int(os.environ.get("CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print(f"\n[crash] random seed {seed} (set CRASH_SEED to replay)")
    env = {"SCRIPTED_MODEL_DELAY_MS": 10}
    # a slower gateway and slower tokens widen the windows a kill can land in
    web, gateway = start_web(tmp_path, REFUND_GATEWAY_DELAY_MS=400)
    procs.append(web)
    orders = [
        (
            f"ORD-{n}",
            "Item arrived broken, please refund." if n % 3 else "Please refund $12.50 of it.",
            None if n % 3 else 1250,
        )
        for n in range(1011, 1023)
    ]
    runs = start_refunds(orders)
    run_ids = [r.id for r, _ in runs.values()]
    workers: list[Proc] = []

    kills = 5
    pending_kill: tuple[set, datetime, int] | None = None  # (in-flight runs, killed_at, round)
    for round_no in range(kills + 1):
        # a fresh qcluster, started right after the previous one was killed
        w = worker(tmp_path, procs, gateway, f"worker-round{round_no}", **env)
        workers.append(w)
        started_at = timezone.now()
        if pending_kill is not None:
            measure_continuation(w, *pending_kill)
        if round_no == kills:
            break  # the last cluster runs everything to the end
        # wait for this cluster to be doing real work, then kill it at a random moment
        try:
            wait_until(
                lambda since=started_at: (
                    all_settled(run_ids)
                    or StepAttempt.objects.filter(
                        step__run_id__in=run_ids, started_at__gt=since
                    ).exists()
                ),
                timeout=90,
                interval=0.05,
                message="the new worker to start a step",
            )
        except TimeoutError:
            raise AssertionError(f"worker round {round_no} did nothing:\n{w.log()}") from None
        if all_settled(run_ids):
            break
        time.sleep(rng.uniform(0.05, 0.8))  # the random moment (not a correctness condition)
        in_flight = set(
            Run.objects.filter(id__in=run_ids, status=RunStatus.RUNNING).values_list(
                "id", flat=True
            )
        )
        killed_at = timezone.now()
        w.kill()
        cut = StepAttempt.objects.filter(step__run_id__in=run_ids, finished_at__isnull=True).count()
        print(
            f"[crash] round {round_no}: SIGKILL of the whole qcluster with {len(in_flight)} run(s) "
            f"running, {cut} step attempt(s) cut mid-step"
        )
        pending_kill = (in_flight, killed_at, round_no) if in_flight else None

    statuses = wait_settled(run_ids, workers, timeout=180)

    waiting = {rid for rid, s in statuses.items() if s == RunStatus.WAITING}
    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        # no order is ever refunded twice, whatever was killed when
        assert GatewayRefund.objects.filter(order_id=order_id).count() <= 1
        if run.id in waiting:
            # the only correct reason to wait here: a reply cut mid-call is `unknown`, for a human
            reply = Step.objects.get(run=run, tool="send_customer_reply")
            assert reply.status == StepStatus.UNKNOWN, (order_id, reply.status)
            approval = Approval.objects.get(step=reply)
            assert (
                approval.kind == ApprovalKind.RECONCILIATION
                and approval.status == ApprovalStatus.PENDING
            )
            assert OutboxMessage.objects.filter(step_id=reply.id).count() <= 1
            # it waits after the refund: that happened exactly once
            assert_refunded_exactly_once(gateway, order_id, amount, run)
            continue
        assert run.status == RunStatus.SUCCEEDED, (order_id, run.status, run.error)
        refund_step = assert_refunded_exactly_once(gateway, order_id, amount, run)
        outcomes = attempt_outcomes(refund_step)
        # every attempt but the last was cut by a kill, and all of them sent the same key
        assert outcomes[-1][1] == AttemptOutcome.SUCCEEDED
        assert all(o == AttemptOutcome.CRASHED for _, o in outcomes[:-1]), outcomes
        assert OutboxMessage.objects.filter(run_id=run.id).count() == 1
        assert TicketNote.objects.filter(ticket__order__order_id=order_id).count() == 1
        assert_gapless(run)
    total_attempts = StepAttempt.objects.filter(step__run_id__in=run_ids).count()
    crashed = StepAttempt.objects.filter(
        step__run_id__in=run_ids, outcome=AttemptOutcome.CRASHED
    ).count()
    print(
        f"[crash] {len(runs)} runs: {len(runs) - len(waiting)} succeeded, {len(waiting)} waiting on a "
        f"reconciliation; {total_attempts} step attempts, {crashed} cut by a kill"
    )


def all_settled(run_ids: list) -> bool:
    return all(
        s in SETTLED for s in Run.objects.filter(id__in=run_ids).values_list("status", flat=True)
    )


def measure_continuation(w: Proc, in_flight: set, killed_at: datetime, round_no: int) -> None:
    """Kill -> the first killed run's next step attempt, on the fresh cluster (restart included)."""

    def next_attempt() -> datetime | None:
        return (
            StepAttempt.objects.filter(step__run_id__in=in_flight, started_at__gt=killed_at)
            .order_by("started_at")
            .values_list("started_at", flat=True)
            .first()
        )

    # the new cluster's sweeper loop writes a heartbeat named after the qcluster pid: "up";
    # the sweeper sets enqueued_at when it rings the doorbell again: "re-enqueued"
    cluster_up: list[datetime] = []
    reenqueued: list[datetime] = []

    def continued() -> datetime | None:
        if (
            not cluster_up
            and WorkerHeartbeat.objects.filter(worker__endswith=f":{w.popen.pid}").exists()
        ):
            cluster_up.append(timezone.now())
        if not reenqueued:
            rung = (
                Run.objects.filter(id__in=in_flight, enqueued_at__gt=killed_at)
                .order_by("enqueued_at")
                .values_list("enqueued_at", flat=True)
                .first()
            )
            if rung:
                reenqueued.append(rung)
        return next_attempt()

    try:
        first = wait_until(continued, timeout=90, interval=0.05, message="a killed run to continue")
    except TimeoutError:
        if all_settled(list(in_flight)):
            return  # they had finished their last step before the kill landed
        raise AssertionError(f"killed runs never continued:\n{w.log()}") from None
    up = f"{(cluster_up[0] - killed_at).total_seconds():.2f}s" if cluster_up else "n/a"
    rung = f"{(reenqueued[0] - killed_at).total_seconds():.2f}s" if reenqueued else "n/a"
    record_gap(
        f"whole-qcluster kill, round {round_no} (fresh qcluster up after ~{up}, "
        f"swept and re-enqueued after {rung}; then the run waits for a free q2 worker)",
        (first - killed_at).total_seconds(),
    )
