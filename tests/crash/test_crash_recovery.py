"""Crash safety with real processes (issue 2): a real `qcluster` and a real daphne serving the
refund gateway, against PostgreSQL. Workers die by failpoint (SIGKILL of a q2 worker process at a
named point) or by SIGKILL of the whole qcluster process group at random moments; every assertion
is made on the outside world: the gateway's own ledger, the outbox, the database rows.

Run with `-s` to see the measured time from a SIGKILL to the run continuing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.utils import timezone

from agentruns.models import (
    AttemptOutcome,
    Run,
    RunEvent,
    RunStatus,
    Step,
    StepAttempt,
    StepStatus,
)
from agentruns.services import start_run
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from support.models import GatewayRefund, OutboxMessage, TicketNote
from tests.crash.kit import (
    assert_refunded_exactly_once,
    attempt_outcomes,
    record_gap,
    start_refunds,
    wait_settled,
    worker,
)
from tests.helpers import assert_gapless, steps
from tests.procs import module_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

GATEWAY_DELAY_MS = 150


# ------------------------------------------------------------------ processes
@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    """A real daphne serving the app, whose /gateway is the refund service the workers call
    (one for the module: its ledger is the database's, truncated after every test)."""
    with module_web(
        tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=GATEWAY_DELAY_MS
    ) as url:
        yield url


# ------------------------------------------------------------------ runs and waiting
REQUESTS = [
    ("ORD-1001", "The blender arrived broken, please refund it.", None),
    ("ORD-1002", "My desk lamp never arrived.", None),
    ("ORD-1003", "Please refund $15 for the scratch on the jacket.", 1500),
]


def marker_time(marker: Path) -> datetime:
    """The failpoint writes its marker right before SIGKILL: its mtime is the kill time."""
    return datetime.fromtimestamp(marker.stat().st_mtime, tz=UTC)


# ------------------------------------------------------------------ failpoints, crash_once
FAILPOINTS = [
    ("step_started", "issue_refund"),
    ("tool_returned", "issue_refund"),
    ("step_persisted", "issue_refund"),
    ("model_streaming", None),
]


@pytest.mark.parametrize(("point", "tool"), FAILPOINTS, ids=[p for p, _ in FAILPOINTS])
def test_failpoint_crash_once_refunds_exactly_once(tmp_path, procs, gateway, seeded, point, tool):
    spec = f"{point}:{tool}=crash_once" if tool else f"{point}=crash_once"
    failpoint_dir = tmp_path / "failpoints"
    env: dict[str, object] = {
        "AGENTRUNS_FAILPOINTS": spec,
        "AGENTRUNS_FAILPOINT_DIR": failpoint_dir,
        # one run per worker process: each crash is that run's own (a crash takes every run of
        # its process with it: tests/crash/test_many_in_flight.py)
        "AGENTRUNS_RUNS_PER_PROCESS": 1,
    }
    if point == "model_streaming":
        # tokens arrive slowly enough that a delta batch is flushed (and the failpoint hit) mid-stream
        env.update(
            SCRIPTED_MODEL_DELAY_MS=3,
            AGENTRUNS_DELTA_FLUSH_MS=5,
            AGENTRUNS_DELTA_FLUSH_CHARS=10_000,
        )
    w = worker(tmp_path, procs, gateway, f"worker-{point}", **env)
    runs = start_refunds(REQUESTS)

    statuses = wait_settled([r.id for r, _ in runs.values()], [w])
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses
    assert GatewayRefund.objects.count() == len(REQUESTS)

    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        refund_step = assert_refunded_exactly_once(gateway, order_id, amount, run)
        # the rest of the flow happened exactly once too
        assert TicketNote.objects.filter(ticket__order__order_id=order_id).count() == 1
        assert OutboxMessage.objects.filter(run_id=run.id).count() == 1
        assert not Step.objects.filter(run=run).exclude(status=StepStatus.SUCCEEDED).exists()
        assert_gapless(run)

        if point == "model_streaming":
            check_model_streaming_recovery(run, failpoint_dir)
            continue
        marker = failpoint_dir / f"{point}-issue_refund-{refund_step.id}"
        assert marker.exists(), f"the {point} failpoint never fired for {order_id}"
        if point == "step_persisted":
            # the result was durable before the crash: the step is never run again
            assert refund_step.attempts == 1
            assert attempt_outcomes(refund_step) == [(1, AttemptOutcome.SUCCEEDED)]
            later = StepAttempt.objects.filter(step__run=run, step__index__gt=refund_step.index)
            first_after = later.order_by("started_at").first()
            record_gap(
                f"{point} {order_id} (next step)",
                (first_after.started_at - marker_time(marker)).total_seconds(),
            )
            continue
        # interrupted mid-call: attempt 1 crashed, attempt 2 resent the same key
        assert refund_step.attempts == 2
        assert attempt_outcomes(refund_step) == [
            (1, AttemptOutcome.CRASHED),
            (2, AttemptOutcome.SUCCEEDED),
        ]
        second = StepAttempt.objects.get(step=refund_step, number=2)
        record_gap(f"{point} {order_id}", (second.started_at - marker_time(marker)).total_seconds())
        assert (
            RunEvent.objects.filter(
                run=run, type="step.recovered", data__step=refund_step.index
            ).count()
            == 1
        )


def check_model_streaming_recovery(run: Run, failpoint_dir: Path) -> None:
    """Each model step that streamed in batches was killed once mid-stream: its partial text was
    superseded, the re-request's text is the step's text, and the final output appears once."""
    model_steps = steps(run, kind="model")
    interrupted = [
        s for s in model_steps if (failpoint_dir / f"model_streaming-refund-{s.id}").exists()
    ]
    assert interrupted, "the model_streaming failpoint never fired"
    for step in interrupted:
        assert step.attempts == 2
        assert attempt_outcomes(step) == [
            (1, AttemptOutcome.CRASHED),
            (2, AttemptOutcome.SUCCEEDED),
        ]
        assert RunEvent.objects.filter(
            run=run, type="model.superseded", data__step=step.index
        ).exists()
        marker = failpoint_dir / f"model_streaming-refund-{step.id}"
        second = StepAttempt.objects.get(step=step, number=2)
        record_gap(
            f"model_streaming step #{step.index}",
            (second.started_at - marker_time(marker)).total_seconds(),
        )
    for step in model_steps:
        deltas = RunEvent.objects.filter(
            run=run, type="model.delta", data__step=step.index
        ).order_by("seq")
        final_text = "".join(e.data["text"] for e in deltas if e.data["attempt"] == step.attempts)
        assert final_text == step.text, f"step #{step.index}: streamed text of the accepted attempt"
    outputs = list(
        RunEvent.objects.filter(run=run, type="run.output").values_list("data", flat=True)
    )
    assert outputs == [{"text": run.output}]
    assert run.output == model_steps[-1].text and run.output.startswith("Done: refunded")
    assert run.output.count("Done: refunded") == 1


# ------------------------------------------------------------------ a reply interrupted after step_started
def test_reply_interrupted_after_step_started_is_unknown_never_resent(
    tmp_path, procs, gateway, seeded
):
    w = worker(
        tmp_path,
        procs,
        gateway,
        "worker-reply",
        AGENTRUNS_RUNS_PER_PROCESS=1,  # each crash is that run's own
        AGENTRUNS_FAILPOINTS="step_started:send_customer_reply=crash_once",
        AGENTRUNS_FAILPOINT_DIR=tmp_path / "failpoints",
    )
    runs = start_refunds(REQUESTS[:2])
    statuses = wait_settled([r.id for r, _ in runs.values()], [w])
    assert set(statuses.values()) == {RunStatus.WAITING}, statuses

    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        assert_refunded_exactly_once(gateway, order_id, amount, run)
        reply = Step.objects.get(run=run, tool="send_customer_reply")
        assert (tmp_path / "failpoints" / f"step_started-send_customer_reply-{reply.id}").exists()
        assert reply.status == StepStatus.UNKNOWN
        assert attempt_outcomes(reply) == [(1, AttemptOutcome.UNKNOWN)]
        approval = Approval.objects.get(step=reply)
        assert (
            approval.kind == ApprovalKind.RECONCILIATION
            and approval.status == ApprovalStatus.PENDING
        )
        assert approval.run_id == run.id
        # the crash came before the call: nothing was sent, and nothing was re-sent
        assert OutboxMessage.objects.filter(step_id=reply.id).count() == 0
        assert OutboxMessage.objects.filter(run_id=run.id).count() == 0
        # the run is parked: no lease, no further steps
        assert run.lease_owner == "" and run.lease_expires_at is None
        assert not Step.objects.filter(run=run, index__gt=reply.index).exists()
        assert_gapless(run)


# ------------------------------------------------------------------ the sweeper's timing rule
def test_sweeper_rerings_a_dead_workers_run_as_soon_as_its_lease_expires(settings, seeded):
    """A run whose lease was renewed after its last doorbell had its task taken by a worker that
    died: it is re-enqueued as soon as the lease expires (TTL + sweep interval), not after the
    resweep guard that protects runs whose task is still waiting in the queue."""
    from datetime import timedelta

    from agentruns.runtime.workers.sweeper import sweep

    settings.AGENTRUNS_LEASE_TTL_SECONDS = 2
    now = timezone.now()
    taken = start_run("refund", {"order_id": "ORD-1001"}).run
    in_queue = start_run("refund", {"order_id": "ORD-1002"}).run
    live = start_run("refund", {"order_id": "ORD-1003"}).run
    # taken at now-2.5s (lease renewed after the doorbell at now-3s), expired 0.5 s ago
    Run.objects.filter(id=taken.id).update(
        status=RunStatus.RUNNING,
        enqueued_at=now - timedelta(seconds=3),
        lease_owner="dead-worker",
        lease_expires_at=now - timedelta(seconds=0.5),
    )
    # re-enqueued 1 s ago after an older lease expired: its task has not been picked up yet
    Run.objects.filter(id=in_queue.id).update(
        status=RunStatus.RUNNING,
        enqueued_at=now - timedelta(seconds=1),
        lease_owner="dead-worker",
        lease_expires_at=now - timedelta(seconds=1.5),
    )
    # a live lease is never touched
    Run.objects.filter(id=live.id).update(
        status=RunStatus.RUNNING,
        enqueued_at=now - timedelta(seconds=30),
        lease_owner="live-worker",
        lease_expires_at=now + timedelta(seconds=1),
    )
    assert sweep(now) == 1
    assert Run.objects.get(id=taken.id).enqueued_at == now
    assert Run.objects.get(id=in_queue.id).enqueued_at == now - timedelta(seconds=1)
    assert Run.objects.get(id=live.id).enqueued_at == now - timedelta(seconds=30)
    # a second sweeper right after rings nobody: the doorbell is now newer than the lease
    assert sweep(now + timedelta(seconds=0.5)) == 0
    # 5 s on: the queued-but-unclaimed one is rung again as a backstop (the guard passed), and
    # the once-live lease has expired by then too
    later = now + timedelta(seconds=5)
    assert sweep(later) == 2
    assert Run.objects.get(id=in_queue.id).enqueued_at == later
    assert Run.objects.get(id=live.id).enqueued_at == later
    assert Run.objects.get(id=taken.id).enqueued_at == now
