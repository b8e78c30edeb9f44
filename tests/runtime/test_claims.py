"""Claims straight from PostgreSQL (runtime/dispatch/claims.py, runtime/workers/claimer.py), in
this process with real pool threads, a real LISTEN connection and PostgreSQL: a start is one
statement and no q2 task, its NOTIFY wakes the claimer, a batch claims each run once (two
claimers included), a run backing off is not claimed early, a NOTIFY nobody heard is caught by
the poll, the sweeper still rings q2 for a run nobody claims, a running run whose lease expired
is re-let (no event) and continued by a claimer without q2.

Real worker processes (a missed NOTIFY caught by the q2 doorbell, SIGKILL under a claim batch):
tests/crash/test_claims.py.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import Run, RunStatus
from agentruns.runtime.dispatch import claims
from agentruns.runtime.dispatch.broker import DoorbellBroker
from agentruns.runtime.execution import transitions
from agentruns.runtime.workers.claimer import RunClaimer
from agentruns.runtime.workers.pool import RunPool
from agentruns.runtime.workers.sweeper import sweep
from agentruns.services import start_run
from tests import testkit
from tests.helpers import assert_gapless, events
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # pool threads have their own connections

ONE_TURN = [{"text": "done"}]


def queue(n: int = 1) -> list[Run]:
    return [start_run("script", {"script": ONE_TURN}).run for _ in range(n)]


def claimed_times(run: Run) -> int:
    """How often the run went queued -> running: its `running` status events."""
    return sum(1 for e in events(run, "run.status") if e.data.get("status") == "running")


def statuses(runs: list[Run]) -> set[str]:
    return set(Run.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


@pytest.fixture
def claimer():
    made: list[tuple[RunPool, RunClaimer]] = []

    def make(capacity: int = 10, *, batch: int = 50, poll: float = 600) -> RunClaimer:
        pool = RunPool(capacity, name=f"pool@claims:{len(made)}", supervise=False)
        each = RunClaimer(pool, batch=batch, poll=poll)
        made.append((pool, each))
        each.start()
        wait_until(lambda: each.listener is not None, timeout=10, message="the claimer to listen")
        return each

    yield make
    testkit.GATE.set()
    for pool, _ in made:
        pool.closing.set()
    with connection.cursor() as cursor:  # wakes every claimer waiting for a NOTIFY (poll: 600 s)
        cursor.execute(f"NOTIFY {claims.CHANNEL}")
    for pool, each in made:
        each.join(timeout=15)
        assert not each.is_alive(), "the claimer stopped once its pool closed"
        wait_until(lambda p=pool: p.in_flight == 0, timeout=30, message="pool threads to finish")
    DoorbellBroker.stop_listening()


def _start_statements() -> tuple[int, int]:
    """(statements, q2 tasks written) of one start, the way the API starts a run."""
    before = OrmQ.objects.count()
    with CaptureQueriesContext(connection) as queries:
        start_run("script", {"script": ONE_TURN})
    return len(queries), OrmQ.objects.count() - before


def test_a_start_is_one_statement_and_its_notify_reaches_a_listener(settings):
    params = connection.get_connection_params()
    for key in ("pool", "cursor_factory", "context"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {claims.CHANNEL}")
        statements, tasks = _start_statements()
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert heard and heard[0].channel == claims.CHANNEL
    assert (statements, tasks) == (1, 0)  # the run, its event and the NOTIFY: one statement

    settings.AGENTRUNS_RUN_CLAIM_BATCH = 0  # as before: a q2 doorbell per start
    statements_before, tasks_before = _start_statements()
    assert tasks_before == 1
    assert statements_before >= statements + 2  # the q2 task's INSERT and its NOTIFY besides


def test_the_notify_wakes_the_claimer_and_each_run_is_claimed_once(claimer):
    each = claimer(capacity=10)  # poll 600 s: only a NOTIFY can wake it
    runs = queue(25)
    wait_until(lambda: statuses(runs) == {RunStatus.SUCCEEDED}, timeout=60, message="the runs")
    assert each.claimed == 25
    assert not OrmQ.objects.exists()  # no q2 task on the way
    for run in runs:
        assert claimed_times(run) == 1
        assert_gapless(run)
    owners = {r.lease_owner for r in Run.objects.filter(id__in=[r.id for r in runs])}
    assert owners == {""}  # finished runs release their leases


def test_never_more_than_the_free_slots_and_the_rest_when_slots_free(claimer):
    testkit.GATE.clear()  # t_charge blocks: slots stay taken
    blocked = [
        start_run("script", {"script": [{"text": "c", "calls": [["t_charge", {"amount": 1}]]}]}).run
        for _ in range(6)
    ]
    each = claimer(capacity=4, batch=3)
    wait_until(lambda: each.pool.in_flight == 4, timeout=30, message="four runs in flight")
    counts = Run.objects.filter(id__in=[r.id for r in blocked])
    assert counts.filter(status=RunStatus.RUNNING).count() == 4
    assert counts.filter(status=RunStatus.QUEUED).count() == 2  # not hoarded
    testkit.GATE.set()
    wait_until(lambda: statuses(blocked) == {RunStatus.SUCCEEDED}, timeout=60, message="all six")
    assert all(claimed_times(run) == 1 for run in blocked)


def test_two_claimers_never_take_the_same_run(claimer):
    first, second = claimer(capacity=20, batch=5), claimer(capacity=20, batch=5)
    runs = queue(40)
    wait_until(lambda: statuses(runs) == {RunStatus.SUCCEEDED}, timeout=90, message="the runs")
    assert first.claimed + second.claimed == 40
    assert all(claimed_times(run) == 1 for run in runs)


def test_a_run_backing_off_is_not_claimed_before_it_is_due():
    (run,) = queue(1)
    due = timezone.now() + timedelta(minutes=5)
    Run.objects.filter(id=run.id).update(enqueued_at=due)
    assert claims.claim_queued(10, transitions.started().events) == []
    Run.objects.filter(id=run.id).update(enqueued_at=timezone.now() - timedelta(seconds=1))
    (claimed,) = claims.claim_queued(10, transitions.started().events)
    stored = Run.objects.get(id=run.id)
    assert (claimed.id, stored.status, stored.lease_owner) == (
        run.id,
        RunStatus.RUNNING,
        claimed.lease_owner,
    )
    # the claim returns the row as it left it: what the run thread executes without reading it
    for field in Run._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(stored, field.attname), field.name
    assert stored.lease_expires_at > timezone.now()
    assert claims.claim_queued(10, transitions.started().events) == []  # its lease is held
    assert_gapless(run)


def test_a_notify_nobody_heard_is_caught_by_the_poll(claimer):
    # created without a NOTIFY (as if sent while the listener reconnected)
    run = start_run("script", {"script": ONE_TURN}, enqueue_task=False).run
    each = claimer(capacity=4, poll=0.3)
    wait_until(lambda: statuses([run]) == {RunStatus.SUCCEEDED}, timeout=30, message="the run")
    assert each.claimed == 1 and claimed_times(run) == 1


def test_the_sweeper_rings_q2_for_a_run_no_claimer_took():
    (run,) = queue(1)
    assert not OrmQ.objects.exists()
    # nobody claimed it for longer than the sweeper's resweep time: the q2 backstop rings it
    Run.objects.filter(id=run.id).update(enqueued_at=timezone.now() - timedelta(minutes=1))
    assert sweep() == 1
    assert OrmQ.objects.count() == 1


def abandon(run: Run) -> Run:
    """The run as a process killed mid-run leaves it: running, its lease expired."""
    (claimed,) = claims.claim_queued(1, transitions.started().events)
    assert claimed.id == run.id
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return Run.objects.get(id=run.id)


def test_a_running_run_whose_lease_expired_is_relet_with_no_event():
    first, second = queue(2)
    dead = abandon(first)
    (live,) = claims.claim_queued(1, transitions.started().events)  # its lease is held
    assert live.id == second.id
    queued_too = start_run("script", {"script": ONE_TURN}).run
    (relet,) = claims.relet_abandoned(10)
    stored = Run.objects.get(id=first.id)
    assert relet.id == first.id and stored.status == RunStatus.RUNNING
    assert stored.lease_owner == relet.lease_owner != dead.lease_owner  # a lease of its own
    assert stored.lease_expires_at > timezone.now()
    assert stored.last_seq == dead.last_seq and claimed_times(stored) == 1  # no event
    for field in Run._meta.concrete_fields:
        assert getattr(relet, field.attname) == getattr(stored, field.attname), field.name
    assert claims.relet_abandoned(10) == []  # held now; the live one and the queued one never
    assert Run.objects.get(id=queued_too.id).status == RunStatus.QUEUED
    assert Run.objects.get(id=second.id).lease_owner == live.lease_owner


def test_the_claimer_continues_an_abandoned_run_without_q2(claimer):
    (run,) = queue(1)
    abandon(run)
    each = claimer(capacity=4, poll=0.3)  # no NOTIFY comes: its poll tick finds it
    wait_until(lambda: statuses([run]) == {RunStatus.SUCCEEDED}, timeout=30, message="the run")
    assert (each.claimed, each.relet) == (1, 1)
    assert claimed_times(run) == 1  # running once: the relet added no status event
    assert not OrmQ.objects.exists()  # no q2 doorbell on the way
    assert_gapless(run)
