"""One refund per request across runs (issue 30's first target; the request is the order's open
ticket since issue 44), with real processes: a real `qcluster` and a real daphne serving the
refund gateway. Two runs on one request are started 10 ms apart, both park for approval
(REFUND_APPROVAL_THRESHOLD_CENTS=0), both are approved: the gateway's own ledger shows ONE
refund, and the other run's model is told it was already done (its tool step's result, its
ticket note, its output). In the order's line the second run starts after the first refunded:
its lookup says the request was paid, and it never reaches the inbox. The same with the worker SIGKILLed right
after the gateway answered the first refund (failpoint `tool_returned:issue_refund=crash_once`):
the key survives the crash, the other run waits for it, the first run's recovery makes its call
again with the same idempotency key, and the gateway replays it.

Run with `-s` to see the measured times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentruns.models import (
    OperationExecution,
    OperationState,
    Run,
    RunEvent,
    RunStatus,
    Step,
    StepStatus,
)
from agentruns.registry.run_input import concurrency
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval, ApprovalKind
from support.models import GatewayRefund, TicketNote
from tests.crash.kit import wait_settled
from tests.procs import gateway_refunds, module_web, start_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

ORDER = "ORD-1001"
KEY = "refund:T-1001"  # the order's open ticket: the request both runs answer


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    with module_web(tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=150) as url:
        yield url


def two_runs_ten_ms_apart() -> list[Run]:
    runs = [start_run("refund", {"order_id": ORDER, "message": "The blender broke."}).run]
    time.sleep(0.01)
    runs.append(start_run("refund", {"order_id": ORDER, "message": "Refund my blender!"}).run)
    return runs


def parked(runs: list[Run], count: int) -> list[Approval]:
    def items() -> list[Approval] | None:
        found = list(Approval.objects.filter(run__in=runs, kind=ApprovalKind.APPROVAL))
        return found if len(found) == count else None

    return wait_until(items, timeout=60, interval=0.1, message=f"{count} run(s) to park")


def approve_all(runs: list[Run], lead, *, in_line: bool) -> None:
    """Both items approved at once, before either has run; in line (the demo's one run per
    order), the second run starts once the first has ended and never parks: its request was
    paid, so it is told, not asked."""
    if not in_line:
        for approval in parked(runs, 2):
            decisions.approve(approval.id, user=lead, version=1)
        return
    first = parked(runs, 1)[0]
    decisions.approve(first.id, user=lead, version=1)


@pytest.mark.parametrize(
    "crash,in_line",
    [(False, False), (True, False), (False, True)],
    ids=["plain", "sigkill-after-gateway", "in-the-orders-line"],
)
def test_two_runs_on_one_order_refund_once(
    tmp_path, procs, gateway, seeded, django_user_model, monkeypatch, crash, in_line
):
    env: dict[str, object] = {
        "REFUND_GATEWAY_URL": gateway + "/gateway",
        "REFUND_APPROVAL_THRESHOLD_CENTS": 0,  # every refund parks for approval
        # without the order's line both runs park at once: the operation key alone decides
        "REFUND_RUNS_PER_ORDER": 1 if in_line else 0,
    }
    if not in_line:  # this process starts the runs: no line here either
        monkeypatch.delitem(concurrency._declared, "refund")
    if crash:
        env["AGENTRUNS_FAILPOINTS"] = "tool_returned:issue_refund=crash_once"
        env["AGENTRUNS_FAILPOINT_DIR"] = tmp_path / "failpoints"
        env["AGENTRUNS_RUNS_PER_PROCESS"] = 1  # the crash is the executing run's own
    worker = start_worker(tmp_path, name="worker-keys", **env)
    procs.append(worker)

    lead = django_user_model.objects.get(username="lead")  # seed_demo's
    runs = two_runs_ten_ms_apart()
    approved_at = time.monotonic()
    approve_all(runs, lead, in_line=in_line)
    statuses = wait_settled([r.id for r in runs], [worker])
    settled_in = time.monotonic() - approved_at
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses

    # ONE refund, by the gateway's own ledger (its table and its HTTP listing)
    ledger = list(GatewayRefund.objects.filter(order_id=ORDER))
    listed = gateway_refunds(gateway, ORDER)
    assert len(ledger) == 1 and len(listed) == 1, listed
    steps = {s.run_id: s for s in Step.objects.filter(run__in=runs, tool="issue_refund")}
    made = next(s for s in steps.values() if "refund_id" in (s.result or {}))
    assert listed[0]["idempotency_key"] == made.idempotency_key
    assert made.result["refund_id"] == f"rf_{ledger[0].pk}"
    other = next(r for r in Run.objects.filter(id__in=[r.id for r in runs]) if r.id != made.run_id)
    if in_line:
        # its lookup said the request was paid: no call, no inbox item
        assert other.id not in steps
        assert not Approval.objects.filter(run=other).exists()
        told = Step.objects.get(run=other, tool="lookup_order")
        assert told.result["request_refunded"]["run_id"] == str(made.run_id)
    else:
        # the other run's model was told it was already done, by which run and when
        told = steps[other.id]
        assert told.status == StepStatus.SUCCEEDED
        assert told.result["already_done"] is True
        assert told.result["done_by_run"] == str(made.run_id)
        assert told.result["result"] == made.result
    assert other.output.startswith(f"Already refunded: this request on order {ORDER}")
    assert other.outcome == "already_refunded"
    assert TicketNote.objects.filter(body__startswith="Not refunded again").count() == 1
    row = OperationExecution.objects.get(key=KEY)
    assert (row.state, row.step_id) == (OperationState.DONE, made.id)

    if crash:
        marker = tmp_path / "failpoints" / f"tool_returned-issue_refund-{made.id}"
        assert marker.exists(), "the failpoint never fired"
        assert made.attempts == 2  # made again after the kill, with the same key
    waited = RunEvent.objects.filter(run=other, type="run.status", data__operation_key=KEY).exists()
    answered = (told.finished_at - made.finished_at).total_seconds()
    print(
        f"\n[operation-keys] {'SIGKILL after the gateway' if crash else 'plain'}: two runs on "
        f"{ORDER} 10 ms apart, both approved: {len(ledger)} refund in the ledger; both settled "
        f"{settled_in:.2f}s after the approvals; the other run "
        f"{'waited for the key and was' if waited else 'was'} answered {answered:.2f}s after "
        "the refund was recorded"
    )
