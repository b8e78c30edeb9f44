"""What the crash tests do alike: start workers that call the real gateway, start refund runs,
wait until they settle, and check the gateway's own ledger."""

from __future__ import annotations

from pathlib import Path

from agentruns.models import Run, RunStatus, Step, StepAttempt, StepStatus
from agentruns.services import start_run
from support.models import GatewayRefund, Order
from tests.procs import Proc, base_env, gateway_refunds, start_worker, wait_until

# a run is settled when it ended or waits for a person
SETTLED = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.WAITING}


def worker(tmp_path: Path, procs: list[Proc], gateway: str, name: str, **env: object) -> Proc:
    """A real qcluster whose refunds go to the real gateway at `gateway` and never park."""
    proc = start_worker(
        tmp_path,
        name=name,
        REFUND_GATEWAY_URL=gateway + "/gateway",
        REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000,
        **env,
    )
    procs.append(proc)
    return proc


def start_refund(order_id: str, message: str, amount: int | None = None) -> tuple[Run, int]:
    """A refund run for the order: (run, the amount it must refund: the order's, or `amount`)."""
    owed = amount if amount is not None else Order.objects.get(order_id=order_id).amount_cents
    return start_run("refund", {"order_id": order_id, "message": message}).run, owed


def wait_settled(run_ids: list, workers: list[Proc], timeout: float = 150) -> dict:
    """Wait until every run is settled; on timeout, fail with the unsettled runs and the logs."""

    def settled() -> dict | None:
        statuses = dict(Run.objects.filter(id__in=run_ids).values_list("id", "status"))
        return statuses if all(s in SETTLED for s in statuses.values()) else None

    try:
        return wait_until(settled, timeout=timeout, interval=0.2, message="runs to finish")
    except TimeoutError:
        left = list(
            Run.objects.filter(id__in=run_ids)
            .exclude(status__in=SETTLED)
            .values_list("id", "status", "lease_owner", "error")
        )
        logs = "\n".join(f"--- {w.log_path.name}\n{w.log()}\n{w.stacks()}" for w in workers)
        raise AssertionError(f"runs did not finish: {left}\n{logs}") from None


def assert_refunded_exactly_once(url: str, order_id: str, amount: int, run: Run) -> Step:
    """The gateway's own ledger (its table and its HTTP listing) shows one refund of `amount`,
    made with the idempotency key of the run's single issue_refund step."""
    refund_step = Step.objects.get(run=run, tool="issue_refund")
    rows = list(GatewayRefund.objects.filter(order_id=order_id))
    assert len(rows) == 1, f"{order_id}: {len(rows)} refunds in the ledger"
    assert rows[0].amount_cents == amount
    assert rows[0].idempotency_key == refund_step.idempotency_key
    listed = gateway_refunds(url, order_id)
    assert [(r["amount_cents"], r["idempotency_key"]) for r in listed] == [
        (amount, refund_step.idempotency_key)
    ]
    assert refund_step.status == StepStatus.SUCCEEDED
    assert refund_step.result["refund_id"] == f"rf_{rows[0].pk}"
    assert refund_step.result["amount_cents"] == amount
    return refund_step


def start_refunds(orders: list[tuple[str, str, int | None]]) -> dict[str, tuple[Run, int]]:
    """Start one refund run per order; returns order_id -> (run, the amount it must refund)."""
    return {
        order_id: start_refund(order_id, message, partial) for order_id, message, partial in orders
    }


def attempt_outcomes(step: Step) -> list[tuple[int, str]]:
    return list(
        StepAttempt.objects.filter(step=step).order_by("number").values_list("number", "outcome")
    )


# Every measured "SIGKILL -> the run's next step attempt starts" gap, printed at the end.
MEASURED: list[tuple[str, float]] = []


def lease_settings() -> str:
    env = base_env()
    return (
        f"AGENTRUNS_LEASE_TTL_SECONDS={env['AGENTRUNS_LEASE_TTL_SECONDS']}, "
        f"AGENTRUNS_SWEEP_INTERVAL_SECONDS={env['AGENTRUNS_SWEEP_INTERVAL_SECONDS']}, "
        f"Q_POLL={env['Q_POLL']}, Q_WORKERS={env['Q_WORKERS']}"
    )


def record_gap(label: str, seconds: float) -> None:
    MEASURED.append((label, seconds))
    print(
        f"[crash-timing] {label}: {seconds:.2f}s from SIGKILL to the next attempt ({lease_settings()})"
    )
