"""`qcluster` stops the same way whichever door the stop signal comes through (issue 31 item 6):
SIGTERM or SIGINT, to its main process alone (`kill PID`, systemd `KillMode=mixed`) or to its
whole process group (systemd's default `KillMode=control-group`, Docker and Kubernetes through an
init that signals the group, a terminal's Ctrl-C), idle or with runs in flight.

Each door is a real qcluster of its own on PostgreSQL (the four stop side by side): it must exit with code 0 within
AGENTRUNS_DRAIN_SECONDS + 5 s leaving no process of its group behind; with runs in flight, every
lease it held is released when it is gone, and another cluster (up before the runs started,
frozen until the signals so the stopped ones take them all) finishes each run, with one refund per
run in the gateway's own ledger. The lease TTL is far longer than the test: a lease left behind
would stall its run visibly. (Before: a SIGTERM to the group killed every worker mid-step and
left the main process hung in q2's stop for good.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import call_command
from django.utils import timezone

from agentruns.models import Run, RunStatus, StepAttempt, WorkerHeartbeat
from support.models import Order, OutboxMessage
from tests.crash import kit
from tests.helpers import assert_gapless
from tests.procs import Proc, module_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

DRAIN_SECONDS = 5  # the bound is this + 5 s; steps here take about a second, so exits come sooner
RUNS = 6  # per cluster
TARGETS = ["main", "group"]
HOST = socket.gethostname()
ENV = {
    "AGENTRUNS_DRAIN_SECONDS": DRAIN_SECONDS,
    "AGENTRUNS_LEASE_TTL_SECONDS": 120,
    "SCRIPTED_MODEL_LATENCY_MS": 700,
    # two q2 worker processes (base_env) of RUNS // 2 slots: each cluster holds RUNS runs
    "AGENTRUNS_RUNS_PER_PROCESS": RUNS // 2,
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker):
    with module_web(tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=600) as url:
        yield url


def cluster_up(proc: Proc) -> None:
    """The sweeper loop of the main process beats once q2 runs."""
    wait_until(
        lambda: (
            not proc.alive
            or WorkerHeartbeat.objects.filter(worker=f"qcluster@{HOST}:{proc.popen.pid}").exists()
        ),
        timeout=60,
        message=f"{proc.log_path.name} to start",
    )
    assert proc.alive, proc.log()


def group_left(proc: Proc) -> list[str]:
    found = subprocess.run(
        ["pgrep", "-g", str(proc.popen.pid), "-a"], capture_output=True, text=True, check=False
    )
    return found.stdout.split("\n") if found.stdout.strip() else []


def stop(proc: Proc, signum: int, target: str) -> float:
    """Send the signal; the seconds until the main process exited (code 0, nothing left)."""
    sent = time.monotonic()
    if target == "group":
        os.killpg(proc.popen.pid, signum)
    else:
        os.kill(proc.popen.pid, signum)
    try:
        code = proc.popen.wait(timeout=DRAIN_SECONDS + 5)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {DRAIN_SECONDS + 5} s after {target} {signal.Signals(signum).name}:\n"
            f"{group_left(proc)}\n{proc.log()}"
        ) from None
    took = time.monotonic() - sent
    assert code == 0, proc.log()
    wait_until(lambda: not group_left(proc), timeout=5, message="the cluster's processes to exit")
    return took


# every way a stop signal comes, each to a cluster of its own; the clusters stop side by side
DOORS = [(signum, target) for signum in (signal.SIGTERM, signal.SIGINT) for target in TARGETS]


def stop_all(clusters: dict[tuple[signal.Signals, str], Proc]) -> dict[str, float]:
    """Each cluster gets its own signal through its own door at once; the seconds each took."""
    with ThreadPoolExecutor(len(clusters)) as threads:
        took = threads.map(lambda door: stop(clusters[door], *door), clusters)
        return {
            f"{signum.name} to {target}": t
            for (signum, target), t in zip(clusters, took, strict=True)
        }


def test_an_idle_cluster_stops_however_it_is_signalled(tmp_path, procs, gateway):
    clusters = {
        door: kit.worker(tmp_path, procs, gateway, f"idle-{door[0].name}-{door[1]}", **ENV)
        for door in DOORS
    }
    for cluster in clusters.values():
        cluster_up(cluster)
    took = stop_all(clusters)
    print(f"[stop-signals] idle: exited in {took}")
    assert not WorkerHeartbeat.objects.filter(worker__startswith="pool@").exists()


def test_runs_in_flight_are_handed_over_however_the_cluster_is_signalled(tmp_path, procs, gateway):
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=RUNS * len(DOORS), stdout=devnull)
    second = kit.worker(
        tmp_path, procs, gateway, "second", **{**ENV, "AGENTRUNS_RUNS_PER_PROCESS": RUNS * 2}
    )
    clusters = {
        door: kit.worker(tmp_path, procs, gateway, f"busy-{door[0].name}-{door[1]}", **ENV)
        for door in DOORS
    }
    cluster_up(second)
    os.killpg(second.popen.pid, signal.SIGSTOP)  # frozen: the others take every run
    for cluster in clusters.values():
        cluster_up(cluster)
    orders = list(Order.objects.order_by("order_id")[: RUNS * len(DOORS)])
    runs = {
        o.order_id: kit.start_refund(o.order_id, "It arrived broken, refund it.") for o in orders
    }
    ids = [run.id for run, _ in runs.values()]
    group_of = {c.popen.pid: door for door, c in clusters.items()}

    def held_by_door() -> dict:
        held: dict = {door: 0 for door in DOORS}
        for owner in Run.objects.filter(id__in=ids, status=RunStatus.RUNNING).values_list(
            "lease_owner", flat=True
        ):
            try:
                held[group_of[os.getpgid(int(owner.split(":")[1]))]] += 1
            except (ProcessLookupError, KeyError, IndexError, ValueError):
                pass
        return held

    wait_until(
        lambda: (
            all(held_by_door().values())
            and StepAttempt.objects.filter(step__run_id__in=ids, step__tool="issue_refund").exists()
        ),
        timeout=90,
        interval=0.05,
        message="runs in flight on every cluster, a refund call started",
    )
    in_flight = held_by_door()
    first_processes = {
        owner.rsplit(":", 1)[0]
        for owner in Run.objects.filter(id__in=ids).values_list("lease_owner", flat=True)
        if owner
    }
    signalled_at = timezone.now()
    os.killpg(second.popen.pid, signal.SIGCONT)
    took = stop_all(clusters)
    print(
        "[stop-signals] runs in flight: "
        + ", ".join(f"{n} {s.name} to {t}" for (s, t), n in in_flight.items())
        + f"; exited in {took}"
    )
    # gone, and no lease of their processes left behind
    kept = [
        owner
        for owner in Run.objects.filter(
            id__in=ids,
            status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
            lease_expires_at__gt=timezone.now(),
        ).values_list("lease_owner", flat=True)
        if owner.rsplit(":", 1)[0] in first_processes
    ]
    assert not kept, kept
    # the second cluster continues them at once (the lease TTL is 120 s)
    kit.wait_settled(ids, [second], timeout=90)
    later = StepAttempt.objects.filter(step__run_id__in=ids, started_at__gt=signalled_at)
    assert {w.rsplit(":", 1)[0] for w in later.values_list("worker", flat=True)} - first_processes
    for order_id, (run, amount) in runs.items():
        run.refresh_from_db()
        assert run.status in (RunStatus.SUCCEEDED, RunStatus.WAITING), (order_id, run.error)
        kit.assert_refunded_exactly_once(gateway, order_id, amount, run)
        assert OutboxMessage.objects.filter(run_id=run.id).count() <= 1
        assert_gapless(run)
