"""The executor and the lease keeper when the database goes away mid-slice (DESIGN.md 4.10).

Real faults from the real PostgreSQL (tests/runtime/dbfaults.py): the test's database stops
taking connections and its sessions are terminated while a tool call is in flight, so the
engine's next statement fails as it does in a restart (a terminated session, then `PoolTimeout`).
A fault is weather: the slice stops without writing, no failed attempt is recorded, the run
never fails, and the lease keeper hands the run back (lease released, doorbell rung) once the
database answers. Only the engine's own errors end a run as "internal error".
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from django.db import OperationalError, connection
from django_q.models import OrmQ

from agentruns.models import AttemptOutcome, Run, RunStatus, StepAttempt, StepStatus
from agentruns.registry import Agent, RetryPolicy, ToolContext, register_agent, tool
from agentruns.runtime.dispatch.lease import Heartbeat
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.outages.faults import database_unavailable
from tests.helpers import advance, assert_gapless, event_types, leased_run, script_run, steps
from tests.procs import wait_until
from tests.runtime.dbfaults import allow_connections, refuse_connections, short_pool_timeout
from tests.testkit import script_policy

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: dict[str, list[tuple[str, int]]] = defaultdict(list)  # tool -> [(key, attempt)]
ARMED: set[str] = set()  # tools whose next call takes the database away


def _call(name: str, ctx: ToolContext) -> None:
    CALLS[name].append((ctx.idempotency_key, ctx.attempt))
    if name in ARMED:
        ARMED.discard(name)
        refuse_connections()


# max_attempts=1: an outage counted as a failed attempt would fail the run at once
@tool(side_effect=True, idempotency="key", retry=RetryPolicy(max_attempts=1))
def o_charge(ctx: ToolContext, amount: int) -> dict:
    """A side effect with an idempotency key; armed, the database goes while it is in flight."""
    _call("o_charge", ctx)
    return {"charged": amount, "key": ctx.idempotency_key}


@tool
def o_lookup(ctx: ToolContext, order: str) -> dict:
    """Read-only: runs inside the model step's commit, which the outage then breaks."""
    _call("o_lookup", ctx)
    return {"order": order, "amount": 5}


@tool(transactional=True, retry=RetryPolicy(max_attempts=1))
def o_ledger(ctx: ToolContext, amount: int) -> dict:
    """Transactional: armed, its own session is terminated mid-transaction (57P01)."""
    CALLS["o_ledger"].append((ctx.idempotency_key, ctx.attempt))
    with connection.cursor() as cursor:
        if "o_ledger" in ARMED:
            ARMED.discard("o_ledger")
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        cursor.execute("SELECT 1")
    return {"written": amount}


def _broken_policy(messages: list[dict]):
    raise RuntimeError("a bug in the engine's own code")


AGENT = "outage-script"
register_agent(
    Agent(
        name=AGENT,
        instructions="Follow the script.",
        tools=["o_charge", "o_lookup", "o_ledger"],
        scripted_policy=script_policy,
    )
)
register_agent(
    Agent(name="outage-broken", instructions="-", tools=[], scripted_policy=_broken_policy)
)


@pytest.fixture(autouse=True)
def _clean():
    CALLS.clear()
    ARMED.clear()
    with short_pool_timeout():
        yield
    allow_connections()


def _advance_through_outage(run: Run, outage_seconds: float = 1.5) -> str:
    """Advance `run` in this thread; the armed tool takes the database away, it comes back
    `outage_seconds` after that."""
    result: dict[str, str] = {}

    def execute() -> None:
        result["outcome"] = RunExecutor(run.id).advance()

    worker = threading.Thread(target=execute)
    worker.start()
    wait_until(lambda: not ARMED, timeout=30, message="the armed tool to be called")
    time.sleep(outage_seconds)
    allow_connections()
    worker.join(60)
    connection.close()
    return result["outcome"]


def _handed_back(run: Run) -> Run:
    """Wait until the lease keeper released the run's lease and rang it; the row."""

    def released() -> Run | None:
        try:
            row = Run.objects.get(id=run.id)
        except OperationalError as exc:
            # this read, too, waits only the short pool timeout: right after the return the pool
            # may still be reconnecting (its next try up to 1 s away, a connect on a loaded box)
            assert database_unavailable(exc), exc
            connection.close()
            return None
        return row if not row.lease_owner and row.enqueued_at != run.enqueued_at else None

    return wait_until(released, timeout=30, message="the keeper to hand the run back")


def _no_failed_attempts(run: Run) -> None:
    outcomes = set(StepAttempt.objects.filter(step__run=run).values_list("outcome", flat=True))
    assert not outcomes & {AttemptOutcome.FAILED, AttemptOutcome.RETRYING}, outcomes
    assert "step.failed" not in event_types(run)
    assert "step.retry_scheduled" not in event_types(run)


def test_database_gone_after_a_side_effect_call_resumes_with_the_same_key():
    run = script_run([{"calls": [["o_charge", {"amount": 5}]]}, {"text": "done"}], agent=AGENT)
    ARMED.add("o_charge")
    assert _advance_through_outage(run) == "weather"

    row = _handed_back(run)
    assert row.status == RunStatus.RUNNING and row.error == ""
    charge = steps(run, "tool")[0]
    # the call went out (its "running + attempt" commit was made): exactly as after a crash
    assert (charge.status, charge.attempts) == (StepStatus.RUNNING, 1)
    _no_failed_attempts(run)
    assert OrmQ.objects.exists()  # its doorbell

    row = advance(row)
    assert row.status == RunStatus.SUCCEEDED, row.error
    charge = steps(run, "tool")[0]
    keys = {key for key, _ in CALLS["o_charge"]}
    assert keys == {charge.idempotency_key}  # same key: the gateway dedupes the second call
    outcomes = list(
        StepAttempt.objects.filter(step=charge).order_by("number").values_list("outcome", flat=True)
    )
    assert outcomes == [AttemptOutcome.CRASHED, AttemptOutcome.SUCCEEDED]
    _no_failed_attempts(run)
    assert_gapless(run)


def test_database_gone_inside_the_model_commit_records_nothing_of_that_turn():
    """The read-only call runs inside the model step's commit, which the outage breaks: neither
    the model step nor the call is recorded; the turn is simply done again."""
    run = script_run([{"calls": [["o_lookup", {"order": "A"}]]}, {"text": "done"}], agent=AGENT)
    ARMED.add("o_lookup")
    assert _advance_through_outage(run) == "weather"

    row = _handed_back(run)
    assert row.status == RunStatus.RUNNING and row.step_count == 0
    assert steps(run) == []
    assert not StepAttempt.objects.filter(step__run=run).exists()

    row = advance(row)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert [(s.kind, s.status, s.attempts) for s in steps(run)] == [
        ("model", "succeeded", 1),
        ("tool", "succeeded", 1),
        ("model", "succeeded", 1),
    ]
    assert len(CALLS["o_lookup"]) == 2
    _no_failed_attempts(run)
    assert_gapless(run)


def test_a_terminated_session_inside_a_transactional_tool_is_not_an_attempt():
    """The transactional call runs inside the model step's commit; its session is terminated
    mid-transaction (57P01): the whole commit rolls back, nothing is counted."""
    run = script_run([{"calls": [["o_ledger", {"amount": 3}]]}, {"text": "done"}], agent=AGENT)
    ARMED.add("o_ledger")
    outcome = RunExecutor(run.id).advance()
    connection.close()
    assert outcome == "weather"
    row = _handed_back(run)
    assert row.status == RunStatus.RUNNING and row.step_count == 0
    assert steps(run) == []

    row = advance(row)
    assert row.status == RunStatus.SUCCEEDED, row.error
    ledger = steps(run, "tool")[0]
    assert (ledger.status, ledger.attempts) == (StepStatus.SUCCEEDED, 1)
    assert len(CALLS["o_ledger"]) == 2
    _no_failed_attempts(run)


def test_a_claim_while_the_database_is_away_writes_nothing_and_rings_later():
    run = script_run([{"text": "done"}], agent=AGENT)
    refuse_connections()
    try:
        outcome = RunExecutor(run.id).advance()
    finally:
        allow_connections()
    connection.close()
    assert outcome == "weather"
    row = _handed_back(run)
    assert row.status == RunStatus.QUEUED and row.error == ""
    assert advance(row).status == RunStatus.SUCCEEDED


def test_the_keeper_flags_no_lease_lost_while_it_cannot_renew():
    """An outage longer than the keeper's renewal period: nobody knows whose the lease is, so no
    executor is told it lost it; once the database answers the lease is renewed."""
    run = leased_run(owner="me:1:keeper", ttl_seconds=0.6)
    beat = Heartbeat(run.id, "me:1:keeper", ttl=0.6)  # renewed every 0.2 s
    refuse_connections()
    beat.start()
    try:
        time.sleep(2.5)  # several failed renewals (each waits the pool's 1 s timeout)
        assert not beat.lost.is_set()
    finally:
        allow_connections()
    try:
        renewed_after = time.monotonic()
        expiry = Run.objects.get(id=run.id).lease_expires_at

        def renewed() -> bool:
            return Run.objects.get(id=run.id).lease_expires_at > expiry

        wait_until(renewed, timeout=15, message="the keeper to renew again")
        assert time.monotonic() - renewed_after < 15
        assert not beat.lost.is_set()
    finally:
        beat.stop()


def test_an_engine_bug_still_ends_the_run_as_internal_error(caplog):
    run = script_run([], agent="outage-broken")
    with caplog.at_level("ERROR", logger="agentruns.runtime.engine.executor"):
        run = advance(run)
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("internal error: RuntimeError(")
    assert any(str(run.id) in r.getMessage() for r in caplog.records)
