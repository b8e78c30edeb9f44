"""Operation keys across runs (issue 30, item 2), with the real engine on the real PostgreSQL:
at most one successful execution per key whichever run calls, enforced by the database; a
second call is answered with the first's result marked already done; a held key (in flight,
or an unknown outcome) makes the second wait; failing for good frees it; a lead allows one
more; the limit is checked before the call while it holds its key.

The tools (`t_refund` and its siblings, tests/testkit.py) write to the gateway's own ledger
table, one row per idempotency key as the gateway does: every assertion counts those rows.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_q.models import OrmQ

from agentruns import services
from agentruns.models import (
    OperationExecution,
    OperationState,
    Run,
    RunStatus,
    StepStatus,
)
from agentruns.registry import get_tool
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.events import EventType
from agentruns.runtime.operations import executions
from agentruns.services import ActionRefused
from approvals import services as decisions
from approvals.models import Approval, ApprovalKind
from support.models import GatewayRefund, Order
from tests import testkit
from tests.helpers import advance, events, steps
from tests.testkit import FAILS, SimulatedCrash, refund_run

ORDER = "ORD-9001"
PAID = 35818


@pytest.fixture
def order(db):
    return Order.objects.create(
        order_id=ORDER,
        customer_name="Ada Lovelace",
        customer_email="ada@example.com",
        amount_cents=PAID,
        currency="USD",
        item="Blender",
    )


def refund_step(run: Run, tool: str = "t_refund"):
    return next(s for s in steps(run, "tool") if s.tool == tool)


def ledger() -> list[tuple[int, str]]:
    return list(
        GatewayRefund.objects.filter(order_id=ORDER)
        .order_by("id")
        .values_list("amount_cents", "idempotency_key")
    )


def crash_then_expire(run: Run) -> None:
    """Advance `run` until its tool "dies" after the gateway answered; its lease then lapses,
    as a SIGKILLed worker's would."""
    with pytest.raises(SimulatedCrash):
        RunExecutor(run.id).advance()
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


# ------------------------------------------------------------------ once per key
def test_a_second_run_is_told_the_first_did_it(order):
    first = advance(refund_run(ORDER, PAID))
    second = advance(refund_run(ORDER, PAID))

    assert first.status == second.status == RunStatus.SUCCEEDED
    made = refund_step(first)
    assert len(ledger()) == 1 and ledger()[0] == (PAID, made.idempotency_key)
    assert len(testkit.CALLS["t_refund"]) == 1  # the second call was never made
    told = refund_step(second)
    assert told.status == StepStatus.SUCCEEDED
    assert told.attempts == 0
    assert told.result["already_done"] is True
    assert told.result["operation_key"] == f"refund:{ORDER}"
    assert told.result["done_by_run"] == str(first.id)
    assert told.result["result"] == made.result
    assert "not done again" in told.result["message"]
    # its model read that answer as the tool's result
    event = next(
        e for e in events(second, EventType.STEP_SUCCEEDED) if e.data["step"] == told.index
    )
    assert event.data["result"]["already_done"] is True
    rows = list(OperationExecution.objects.filter(key=f"refund:{ORDER}"))
    assert [(r.slot, r.state, r.step_id) for r in rows] == [(1, OperationState.DONE, made.id)]


def test_the_database_allows_one_live_execution_per_slot_and_one_held_per_key(order):
    def row(slot: int, state: str) -> OperationExecution:
        return OperationExecution(
            key="k", slot=slot, state=state, run_id=uuid.uuid4(), step_id=uuid.uuid4(), tool="t"
        )

    OperationExecution.objects.create(**_fields(row(1, OperationState.DONE)))
    for twin in (row(1, OperationState.DONE), row(1, OperationState.HELD)):
        with pytest.raises(IntegrityError), transaction.atomic():
            OperationExecution.objects.create(**_fields(twin))
    OperationExecution.objects.create(**_fields(row(2, OperationState.HELD)))
    with pytest.raises(IntegrityError), transaction.atomic():
        OperationExecution.objects.create(**_fields(row(3, OperationState.HELD)))
    # a released slot is free again
    OperationExecution.objects.filter(slot=2).update(state=OperationState.RELEASED)
    OperationExecution.objects.create(**_fields(row(2, OperationState.HELD)))


def _fields(row: OperationExecution) -> dict:
    return {f: getattr(row, f) for f in ("key", "slot", "state", "run_id", "step_id", "tool")}


@pytest.mark.django_db(transaction=True)
def test_two_calls_racing_for_a_key_one_takes_it(order):
    """Two transactions take the same key at once: the unique constraint keeps one; the other
    waits for the winner's commit and then finds the key held."""
    started = threading.Event()

    def take(hold: float):
        step_id = uuid.uuid4()
        with transaction.atomic():
            if hold:
                answer = executions.take("race", run_id=uuid.uuid4(), step_id=step_id, tool="t")
                started.set()
                time.sleep(hold)  # the other INSERT arrives while this one is uncommitted
            else:
                started.wait(10)
                answer = executions.take("race", run_id=uuid.uuid4(), step_id=step_id, tool="t")
        connection.close()
        return type(answer).__name__, getattr(answer, "fresh", None)

    results: list = [None, None]
    threads = [
        threading.Thread(target=lambda i=i, h=h: results.__setitem__(i, take(h)))
        for i, h in enumerate((0.5, 0))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [("Busy", None), ("Taken", True)]
    assert OperationExecution.objects.filter(key="race").count() == 1


# ------------------------------------------------------------------ a held key
def test_a_key_held_across_a_crash_makes_the_second_wait_and_rings_it(
    order, django_capture_on_commit_callbacks
):
    FAILS["t_refund_crash"] = 1
    first = refund_run(ORDER, PAID)
    crash_then_expire(first)
    assert refund_step(first).status == StepStatus.RUNNING
    held = OperationExecution.objects.get(key=f"refund:{ORDER}")
    assert held.state == OperationState.HELD and held.step_id == refund_step(first).id

    second = advance(refund_run(ORDER, PAID))
    assert second.status == RunStatus.QUEUED  # waiting, holding no thread
    assert f"waiting for refund:{ORDER}: run {str(first.id)[:8]} is executing it" in second.error
    assert refund_step(second).status == StepStatus.PENDING
    held.refresh_from_db()
    assert held.waiters == [str(second.id)]

    # the first run's recovery makes its call again with the same key (the gateway answers
    # with its refund) and is not refused by the order's limit its own refund fills
    with django_capture_on_commit_callbacks(execute=True):
        doorbells = OrmQ.objects.count()
        first = advance(first)
    assert first.status == RunStatus.SUCCEEDED
    assert OrmQ.objects.count() == doorbells + 1  # the waiting run was rung
    second = advance(second)
    assert second.status == RunStatus.SUCCEEDED
    assert refund_step(second).result["done_by_run"] == str(first.id)
    assert ledger() == [(PAID, refund_step(first).idempotency_key)]
    keys = {key for key, _, _ in testkit.CALLS["t_refund"]}
    assert keys == {refund_step(first).idempotency_key}  # made twice, with one key


def test_a_call_failing_for_good_frees_the_key(order):
    FAILS["t_refund_fatal"] = 1
    first = advance(refund_run(ORDER, PAID))
    assert first.status == RunStatus.FAILED
    assert OperationExecution.objects.get(key=f"refund:{ORDER}").state == OperationState.RELEASED

    second = advance(refund_run(ORDER, PAID))
    assert second.status == RunStatus.SUCCEEDED
    assert ledger() == [(PAID, refund_step(second).idempotency_key)]
    assert "already_done" not in refund_step(second).result


def test_a_retried_call_keeps_its_key_and_is_not_refused_by_its_own_refund(order):
    FAILS["t_refund"] = 1  # one transient failure, then the same key again
    run = advance(refund_run(ORDER, PAID))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert refund_step(run).attempts == 2
    assert len(ledger()) == 1


@pytest.mark.parametrize("resolution", ["happened", "abort"])
def test_an_unknown_outcome_holds_the_key_until_reconciled(
    order, lead, resolution, django_capture_on_commit_callbacks
):
    FAILS["t_refund_once_crash"] = 1
    first = refund_run(ORDER, PAID, tool="t_refund_once")
    crash_then_expire(first)
    first = advance(first)  # recovery: no idempotency key, so the outcome is unknown
    assert first.status == RunStatus.WAITING
    assert refund_step(first, "t_refund_once").status == StepStatus.UNKNOWN

    second = advance(refund_run(ORDER, PAID))
    assert second.status == RunStatus.QUEUED
    assert "is unknown until someone reconciles it in the inbox" in second.error

    item = Approval.objects.get(run=first, kind=ApprovalKind.RECONCILIATION)
    result = {"refund_id": "rf_by_hand", "amount_cents": PAID}
    with django_capture_on_commit_callbacks() as rung:
        decisions.reconcile(item.id, user=lead, resolution=resolution, result=result)
    rings = [cb for cb in rung if getattr(cb, "args", None) == (str(second.id),)]
    assert len(rings) == 1  # the waiting run is rung when the decision commits
    second = advance(second)
    assert second.status == RunStatus.SUCCEEDED
    told = refund_step(second).result
    assert told["already_done"] is True and told["done_by_run"] == str(first.id)
    if resolution == "happened":
        assert told["result"] == result
    else:  # aborted: nobody can say it did not happen
        assert told["result"]["outcome_unknown"] is True
        assert "never confirmed" in told["message"]
    assert len(ledger()) == 1  # the one the first call made before its worker died


def test_a_cancelled_run_leaves_its_held_key_used_not_stuck(order, lead):
    FAILS["t_refund_crash"] = 1
    first = refund_run(ORDER, PAID)
    crash_then_expire(first)
    services.cancel_run(first.id, user=lead)
    row = OperationExecution.objects.get(key=f"refund:{ORDER}")
    assert row.state == OperationState.DONE and row.result["outcome_unknown"] is True
    second = advance(refund_run(ORDER, PAID))
    assert refund_step(second).result["already_done"] is True


# ------------------------------------------------------------------ one more, and the limit
def test_a_lead_allows_one_more_execution_and_it_is_on_the_timeline(
    order, lead, operator, approver
):
    first = advance(refund_run(ORDER, 10_000))
    blocked = advance(refund_run(ORDER, 12_000))
    assert refund_step(blocked).result["already_done"] is True

    with pytest.raises(PermissionDenied):
        services.allow_operation(f"refund:{ORDER}", user=approver, reason="no right")
    allowance = services.allow_operation(
        f"refund:{ORDER}", user=lead, reason="a second item came back", run_id=blocked.id
    )
    assert (allowance.slot, allowance.granted_by_name) == (2, "lead")
    with pytest.raises(ActionRefused, match="already allowed .* not used yet"):
        services.allow_operation(f"refund:{ORDER}", user=lead, reason="twice")
    with pytest.raises(ActionRefused, match="has not been executed"):
        services.allow_operation("refund:ORD-9999", user=lead)
    allowed = events(blocked, EventType.OPERATION_ALLOWED)
    assert [(e.data["key"], e.data["slot"], e.data["by"]) for e in allowed] == [
        (f"refund:{ORDER}", 2, "lead")
    ]

    third = advance(refund_run(ORDER, 12_000))
    assert "already_done" not in refund_step(third).result
    assert [amount for amount, _ in ledger()] == [10_000, 12_000]
    fourth = advance(refund_run(ORDER, 1_000))
    assert refund_step(fourth).result["done_by_run"] == str(third.id)
    assert first.status == RunStatus.SUCCEEDED


def test_a_keys_state_reads_its_allowances_only_once_it_was_taken(
    order, lead, django_assert_num_queries
):
    """A key never taken (a request's first refund, looked up before every proposal) is read in
    one query; one that was taken reads its allowances too, and shows the one a lead granted."""
    never = f"refund:{ORDER}"
    with django_assert_num_queries(1):
        state = executions.key_state(never)
    assert (state.status, state.slots, state.allowances) == ("free", 1, [])
    advance(refund_run(ORDER, 10_000))
    services.allow_operation(never, user=lead, reason="a second item came back")
    with django_assert_num_queries(2):
        states = executions.key_states([never, "refund:ORD-9999"])
    assert (states[never].status, states[never].slots) == ("free", 2)
    assert [a.granted_by_name for a in states[never].allowances] == ["lead"]
    assert (states["refund:ORD-9999"].status, states["refund:ORD-9999"].allowances) == ("free", [])


def test_the_limit_is_checked_right_before_the_call(order, lead):
    advance(refund_run(ORDER, 30_000))
    services.allow_operation(f"refund:{ORDER}", user=lead, reason="partial")
    over = advance(refund_run(ORDER, 10_000))

    step = refund_step(over)
    assert step.status == StepStatus.REJECTED
    assert step.result["reason"] == (
        "refused: this refund of 100.00 USD would bring the order's refunds to 400.00 of "
        "358.18 USD paid; the call was not made"
    )
    assert len(testkit.CALLS["t_refund"]) == 1 and len(ledger()) == 1
    # the refused call left the allowed slot free: a smaller refund takes it
    within = advance(refund_run(ORDER, 5_818))
    assert "refund_id" in refund_step(within).result
    assert sum(amount for amount, _ in ledger()) == PAID


def test_a_run_keeps_whether_its_tool_takes_a_key(order, monkeypatch):
    """Frozen policy: a run whose snapshot says the tool takes a key, run by code whose tool
    declares none, is refused (it could not be deduplicated); a run from before keys existed
    (no such field in its snapshot) follows the deployed tool."""
    run = refund_run(ORDER, PAID)
    monkeypatch.setattr(get_tool("t_refund"), "operation_key", None)
    run = advance(run)
    assert refund_step(run).status == StepStatus.REJECTED
    assert "could not be deduplicated" in refund_step(run).result["reason"]
    monkeypatch.undo()

    older = refund_run(ORDER, PAID)
    snapshot = dict(older.tool_snapshot)
    snapshot["t_refund"] = {k: v for k, v in snapshot["t_refund"].items() if k != "operation_key"}
    Run.objects.filter(id=older.id).update(tool_snapshot=snapshot)
    made = advance(older)
    again = advance(refund_run(ORDER, PAID))
    assert "refund_id" in refund_step(made).result
    assert refund_step(again).result["done_by_run"] == str(made.id)
