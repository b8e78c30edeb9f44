"""Claims from PostgreSQL with real qcluster processes, the real gateway and SIGKILL: a NOTIFY
nobody heard is caught by q2's doorbell (the sweeper's backstop), a cluster killed right after
its claimers took a batch loses no run and executes none twice (the gateway's ledger), a run
whose process was SIGKILLed mid-step is re-let by a claimer with the sweeper away, and a
database restart leaves the claimers listening again (on a PostgreSQL server of the test's own).

In-process (one statement per start, batches, two claimers, the poll): tests/runtime/test_claims.py.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import pytest
from django.core.management import call_command
from django.db.models import Count
from django.utils import timezone

from agentruns.models import AttemptOutcome, Run, RunStatus, StepAttempt, WorkerHeartbeat
from agentruns.runtime.dispatch import claims
from agentruns.services import start_run
from support.models import GatewayRefund, Order
from tests.crash import kit
from tests.crash.kit import assert_refunded_exactly_once
from tests.helpers import assert_gapless
from tests.pgserver import PrivatePostgres
from tests.procs import (
    Proc,
    gateway_refunds,
    module_web,
    start_run_over_http,
    start_web,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker):
    with module_web(tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=200) as url:
        yield url


@pytest.fixture
def seeded(transactional_db):
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=60, stdout=devnull)


worker = kit.worker  # (a qcluster calling the gateway; base_env: no model delay)


def pools_up(proc: Proc, since: datetime, processes: int = 2) -> None:
    """Every q2 worker process of the cluster spawned its pool (and with it its claimer)."""
    wait_until(
        lambda: (
            WorkerHeartbeat.objects.filter(
                worker__startswith=WorkerHeartbeat.POOL_PREFIX, last_seen_at__gt=since
            ).count()
            >= processes
        ),
        timeout=60,
        message=f"{proc.log_path.name}'s worker processes",
    )


def refund(order_id: str, **start: object) -> tuple[Run, int]:
    order = Order.objects.get(order_id=order_id)
    message = {"order_id": order_id, "message": "It arrived broken, refund it."}
    return start_run("refund", message, **start).run, order.amount_cents


def test_a_notify_nobody_heard_is_rung_by_the_q2_doorbell(tmp_path, procs, gateway, seeded):
    # the claimers only wake on a NOTIFY (their poll is far away)
    since = timezone.now()
    w = worker(tmp_path, procs, gateway, "worker-missed", AGENTRUNS_RUN_CLAIM_POLL_SECONDS=600)
    pools_up(w, since)
    # each claimer's first look (what was queued while nobody listened) comes after its pool's
    # heartbeat: a run made before that look is taken by it, not missed (a CI run: started 9 ms
    # after it was made). A run that settles first outlasts those looks
    probe, _ = refund("ORD-1003")
    kit.wait_settled([probe.id], [w], timeout=90)
    # no NOTIFY and no doorbell: as if its NOTIFY was sent while no claimer listened
    missed, amount = refund("ORD-1002", enqueue_task=False)
    kit.wait_settled([missed.id], [w], timeout=90)
    # then one whose NOTIFY a claimer hears (after: a claim takes every queued run it finds)
    heard, amount_heard = refund("ORD-1001")
    kit.wait_settled([heard.id], [w], timeout=90)
    for run in (heard, missed):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert_gapless(run)
    assert_refunded_exactly_once(gateway, "ORD-1001", amount_heard, heard)
    assert_refunded_exactly_once(gateway, "ORD-1002", amount, missed)
    # the missed one started only when the sweeper rang q2 for it (queued longer than its
    # resweep time, max(lease TTL, 5 s)); the heard one at once
    assert (missed.started_at - missed.created_at).total_seconds() >= 4.5
    assert (heard.started_at - heard.created_at).total_seconds() < 3


def test_sigkill_right_after_a_claim_batch_loses_no_run_and_runs_none_twice(
    tmp_path, procs, gateway, seeded
):
    env = {"AGENTRUNS_RUNS_PER_PROCESS": 12, "SCRIPTED_MODEL_LATENCY_MS": 300}
    since = timezone.now()
    first = worker(tmp_path, procs, gateway, "worker-claims", **env)
    pools_up(first, since)
    runs = {f"ORD-{n}": refund(f"ORD-{n}") for n in range(1001, 1041)}
    ids = [run.id for run, _ in runs.values()]

    def claimed_by_a_batch() -> int:
        # a batch's lease owner is its tag plus the run's id ("host:pid:tag/1234abcd")
        return Run.objects.filter(
            id__in=ids, status=RunStatus.RUNNING, lease_owner__contains="/"
        ).count()

    wait_until(lambda: claimed_by_a_batch() >= 8, timeout=60, interval=0.02, message="a batch")
    claimed = claimed_by_a_batch()
    first.kill()  # SIGKILL of the whole cluster, its claimed runs leased to dead processes
    untouched = (
        Run.objects.filter(id__in=ids, status=RunStatus.RUNNING).filter(steps__isnull=True).count()
    )
    print(f"\n[claims] SIGKILL with {claimed} runs claimed, {untouched} not yet past the claim")

    second = worker(tmp_path, procs, gateway, "worker-after", **env)
    kit.wait_settled(ids, [first, second])
    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        # a reply cut mid-call waits on a reconciliation; the refund happened once either way
        assert run.status in (RunStatus.SUCCEEDED, RunStatus.WAITING), (order_id, run.error)
        assert_refunded_exactly_once(gateway, order_id, amount, run)
        assert_gapless(run)
    assert GatewayRefund.objects.count() == len(runs)
    twice = (
        StepAttempt.objects.filter(step__run_id__in=ids, outcome=AttemptOutcome.SUCCEEDED)
        .values("step_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not twice.exists(), "a step that succeeded was executed again"


def test_a_killed_process_s_run_continues_on_a_claimer_with_the_sweeper_away(
    tmp_path, procs, gateway, seeded
):
    # the fast sweeper far away (its q2 schedule fires once a minute at best): only a claimer's
    # poll can give the run to a live process within seconds
    env = {
        "AGENTRUNS_SWEEP_INTERVAL_SECONDS": 600,
        "AGENTRUNS_RUN_CLAIM_POLL_SECONDS": 0.5,
        "SCRIPTED_MODEL_LATENCY_MS": 1500,
    }
    since = timezone.now()
    w = worker(tmp_path, procs, gateway, "worker-relet", **env)
    pools_up(w, since)
    run, amount = refund("ORD-1003")

    def mid_run() -> str | None:  # claimed by a batch, its first step begun
        row = Run.objects.filter(id=run.id, status=RunStatus.RUNNING, steps__isnull=False)
        return row.values_list("lease_owner", flat=True).first()

    owner = wait_until(mid_run, timeout=60, interval=0.02, message="the run mid-step")
    pid = int(owner.split(":")[1])  # "host:pid:tag/1234abcd"
    os.kill(pid, signal.SIGKILL)  # one worker process; q2 spawns another, the sibling lives
    killed = time.monotonic()

    def continued() -> str | None:
        owner_now = Run.objects.filter(id=run.id).values_list("lease_owner", flat=True).first()
        return owner_now if owner_now and owner_now != owner else None

    wait_until(continued, timeout=15, interval=0.05, message="another process to take the run")
    taken_after = time.monotonic() - killed
    kit.wait_settled([run.id], [w], timeout=60)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert_refunded_exactly_once(gateway, "ORD-1003", amount, run)
    assert_gapless(run)
    print(
        f"\n[claims] SIGKILL mid-step, sweeper away: another process took the run after "
        f"{taken_after:.2f}s (lease TTL 2 s)"
    )


# ------------------------------------------------------------------ a database restart
@pytest.fixture
def private_pg():
    pg = PrivatePostgres("claims")
    pg.start()
    pg.create_database()
    yield pg
    pg.close()


def claim_delay(pg: PrivatePostgres, run_id: str) -> float | None:
    """Seconds from the run's creation to its claim once it succeeded, None before."""
    with pg.connect() as conn:
        row = conn.execute(
            f"SELECT status, started_at - created_at FROM {Run._meta.db_table} WHERE id = %s",
            [run_id],
        ).fetchone()
    return row[1].total_seconds() if row and row[0] == RunStatus.SUCCEEDED else None


def listening_claimers(pg: PrivatePostgres) -> int:
    """Sessions whose last statement was the claimers' LISTEN (each claimer has its own)."""
    with pg.connect() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s", [f"LISTEN {claims.CHANNEL}"]
        ).fetchone()[0]


def start_when_up(url: str, token: str, order_id: str) -> str:
    """POST /api/runs, again while the web answers 503 (its pool reconnecting after a restart)."""
    run_input = {"order_id": order_id, "message": "It arrived broken, refund it."}

    def started() -> str | None:
        try:
            return start_run_over_http(url, token, run_input)
        except AssertionError:
            return None

    return wait_until(started, timeout=60, interval=0.5, message="the web to start a run")


def test_a_claimer_listens_again_after_a_database_restart(tmp_path, private_pg):
    # the web is the refund gateway too; the claimers wake only on a NOTIFY (poll far away) or
    # when they have just (re)connected
    env = {"DATABASE_URL": private_pg.url, "AGENTRUNS_RUN_CLAIM_POLL_SECONDS": "600"}
    private_pg.migrate()
    token = private_pg.lead_token
    web, url = start_web(tmp_path, **env)
    worker_proc = start_worker(
        tmp_path, name="worker-restart", REFUND_GATEWAY_URL=f"{url}/gateway", **env
    )
    try:
        first = start_when_up(url, token, "ORD-1001")
        wait_until(lambda: claim_delay(private_pg, first) is not None, timeout=90, message="first")
        private_pg.restart()  # every session ends, the claimers' LISTEN connections included
        private_pg.wait_up()
        wait_until(  # the claimers listen again (their backoff is capped at 1 s)
            lambda: listening_claimers(private_pg) >= 2,  # one per q2 worker process (Q_WORKERS)
            timeout=30,
            message="both claimers to LISTEN again",
        )
        second = start_when_up(url, token, "ORD-1002")
        wait_until(
            lambda: claim_delay(private_pg, second) is not None, timeout=90, message="second"
        )
        # claimed on its NOTIFY, not rung by the sweeper's q2 doorbell (at least 5 s later)
        assert claim_delay(private_pg, second) < 4.5
        assert worker_proc.alive, worker_proc.log()
        for order_id in ("ORD-1001", "ORD-1002"):
            assert len(gateway_refunds(url, order_id)) == 1
    except TimeoutError:
        with private_pg.connect() as conn:
            runs = conn.execute(f"SELECT id, status, error FROM {Run._meta.db_table}").fetchall()
        pytest.fail(f"{runs}\n{worker_proc.log()}\n{web.log()}")
    finally:
        worker_proc.kill()
        web.kill()
