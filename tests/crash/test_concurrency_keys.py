"""Concurrency keys with a real worker cluster (issue 30): the demo refund agent takes one run
per order at a time. The database is sampled every 50 ms from a connection of the test's own
(`benchmarks.sampling.KeySampler`): never two runs of one order running, or holding the order,
at once. Two runs on one order started 10 ms apart over the API take turns, the second saying
which run it waits behind; a batch on few orders all finishes; a holder whose worker process is
SIGKILLed mid-call keeps the order while it is recovered, and only its end admits the next.

In-process (the statements, cancel, retry, fork, priority): tests/runtime/test_concurrency_keys.py.
The benchmark (200 runs on 20 orders against 200 on 200): benchmarks/concurrency_keys.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from agentruns.models import Run, RunStatus, Step
from agentruns.services import start_run
from agentruns.tokens import create_token
from benchmarks.sampling import KeySampler
from support.models import GatewayRefund
from tests import procs as proc_kit
from tests.crash.kit import wait_settled, worker
from tests.helpers import assert_gapless
from tests.procs import module_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

TURN_MS = 100  # every model turn waits this long: runs of one order overlap unless kept apart


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker):
    with module_web(tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=100) as url:
        yield url


@pytest.fixture
def sampler():
    sampling = KeySampler(proc_kit.test_database_url(), "refund", interval=0.05)
    sampling.start()
    yield sampling
    sampling.stop()


def start_over_api(url: str, token: str, order_id: str) -> dict:
    response = httpx.post(
        f"{url}/api/runs",
        json={"agent": "refund", "input": {"order_id": order_id, "message": "Broken, refund."}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    return response.json()


def assert_took_turns(sampler: KeySampler, runs: list[Run]) -> None:
    samples, running, holding = sampler.peaks()
    assert samples >= 10, f"only {samples} samples"
    assert running <= 1 and holding <= 1, sampler.most_running
    by_order: dict[str, list[Run]] = {}
    for run in runs:
        by_order.setdefault(run.concurrency_key, []).append(run)
    for order_runs in by_order.values():  # one after the other, in start order
        ordered = sorted(order_runs, key=lambda r: r.created_at)
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert after.started_at >= before.finished_at, (before.id, after.id)


def test_two_runs_on_one_order_started_10ms_apart_take_turns(
    tmp_path, procs, gateway, seeded, sampler
):
    w = worker(tmp_path, procs, gateway, "keys-pair", SCRIPTED_MODEL_LATENCY_MS=TURN_MS)
    token = create_token(get_user_model().objects.get(username="lead"))
    first = start_over_api(gateway, token, "ORD-1001")
    time.sleep(0.01)
    second = start_over_api(gateway, token, "ORD-1001")
    assert second["status"] == "queued" and second["waiting_behind"] == first["id"]
    assert f"waiting behind run {first['id'][:8]}" in second["waiting_reason"]

    statuses = wait_settled([first["id"], second["id"]], [w], timeout=90)
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses
    runs = list(Run.objects.filter(id__in=[first["id"], second["id"]]))
    assert_took_turns(sampler, runs)
    for run in runs:
        assert_gapless(run)


def test_a_batch_on_few_orders_finishes_one_run_per_order_at_a_time(
    tmp_path, procs, gateway, seeded, sampler
):
    w = worker(tmp_path, procs, gateway, "keys-batch", SCRIPTED_MODEL_LATENCY_MS=TURN_MS)
    orders = [f"ORD-{1001 + i}" for i in range(4)]

    def start(i: int):
        order = orders[i % len(orders)]
        try:
            return start_run("refund", {"order_id": order, "message": "Broken, refund."}).run.id
        finally:
            connection.close()  # this client thread's own

    with ThreadPoolExecutor(6) as clients:  # 24 starts at once, six per order
        ids = list(clients.map(start, range(24)))
    statuses = wait_settled(ids, [w], timeout=150)
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses
    assert_took_turns(sampler, list(Run.objects.filter(id__in=ids)))


def test_a_sigkilled_holder_keeps_its_order_while_it_is_recovered(
    tmp_path: Path, procs, gateway, seeded, sampler
):
    failpoints = tmp_path / "failpoints"
    w = worker(
        tmp_path,
        procs,
        gateway,
        "keys-crash",
        SCRIPTED_MODEL_LATENCY_MS=TURN_MS,
        # each refund call kills its q2 worker process once, after the gateway was called or
        # not: the run is recovered by another process (re-let or rung) with the same key
        AGENTRUNS_FAILPOINTS="step_started:issue_refund=crash_once",
        AGENTRUNS_FAILPOINT_DIR=failpoints,
    )
    first = start_run("refund", {"order_id": "ORD-1001", "message": "Broken, refund."}).run
    second = start_run("refund", {"order_id": "ORD-1001", "message": "Still broken."}).run
    # the first run's worker process is dead: while its lease lapses and it is recovered, the
    # second still waits behind it
    wait_until(lambda: any(failpoints.glob("*")), timeout=60, message="the first SIGKILL")
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < 1.5:
        row = Run.objects.get(id=second.id)
        assert row.status == RunStatus.QUEUED and row.waiting_behind == first.id
        assert Run.objects.get(id=first.id).holds_key
        time.sleep(0.05)

    statuses = wait_settled([first.id, second.id], [w], timeout=120)
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses
    runs = list(Run.objects.filter(id__in=[first.id, second.id]))
    assert_took_turns(sampler, runs)
    # the first run's refund call was killed once and recovered with the same key, which the
    # gateway executed once (its ledger)
    refund = Step.objects.get(run=first, tool="issue_refund")
    assert refund.attempts == 2
    assert GatewayRefund.objects.filter(idempotency_key=refund.idempotency_key).count() == 1
    for run in runs:
        assert_gapless(run)
