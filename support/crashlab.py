"""The crash lab: the same three-step support flow run two ways against one gateway ledger.

Group A (naive): the whole turn is one retryable django-q2 task with no step records; each
delivery makes up a new operation key, so a redelivery after the remote succeeded refunds again.
Group B (durable): the engine, with per-step records and the step's stable idempotency key.

Both run in a real `qcluster` process that a failpoint hard-kills (SIGKILL) at the fault point;
recovery is whatever each design does on its own (q2 redelivery for A, lease + sweeper for B).
One cluster per fault point serves A's turn, then B's run: the failpoint fires once per step
(A's turn is keyed by its own id, B's by the step's), and q2 starts a fresh worker process after
each kill, so B meets the cluster as a fresh one would, without a second start's seconds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from django.db import connection

from agentruns.models import Run, Step
from agentruns.runtime.execution import failpoints
from support.models import GatewayRefund, Order, OutboxMessage, Ticket, TicketNote

ROOT = Path(__file__).resolve().parent.parent

FAULTS = {
    "before_refund_call": "step_started:issue_refund",
    "after_remote_success": "tool_returned:issue_refund",
    "after_persisted": "step_persisted:issue_refund",
    "while_reply_streams": "model_streaming",
}


# ------------------------------------------------------------------ group A: the naive task
def naive_turn(lab_run_id: str, order_id: str, message: str, gateway_url: str) -> str:
    """Look up, refund, write the reply: one task, retried whole by q2 after a crash."""
    order = Order.objects.get(order_id=order_id)  # look up
    key = f"naive-{uuid.uuid4().hex}"  # nothing persisted, so nothing stable to send
    failpoints.hit("step_started", tool="issue_refund", step_id=lab_run_id)
    response = httpx.post(
        gateway_url.rstrip("/") + "/refunds",
        json={"order_id": order_id, "amount_cents": order.amount_cents, "reason": message},
        headers={"Idempotency-Key": key},
        timeout=10,
    )
    response.raise_for_status()
    failpoints.hit("tool_returned", tool="issue_refund", step_id=lab_run_id)
    ticket = order.tickets.first()
    if ticket is not None:
        TicketNote.objects.create(ticket=ticket, body=f"refunded ({key})", idempotency_key=key)
    failpoints.hit("step_persisted", tool="issue_refund", step_id=lab_run_id)
    failpoints.hit("model_streaming", tool="refund", step_id=lab_run_id)
    OutboxMessage.objects.create(
        order=order,
        to=order.customer_email,
        body="We refunded your order.",
        run_id=uuid.UUID(lab_run_id),
    )
    return key


# ------------------------------------------------------------------ processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: object) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AGENTRUNS_FAILPOINTS", None)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "AGENTRUNS_LEASE_TTL_SECONDS": "2",
            "AGENTRUNS_SWEEP_INTERVAL_SECONDS": "0.5",
            "SCRIPTED_MODEL_DELAY_MS": "5",
            "AGENTRUNS_DELTA_FLUSH_MS": "10",
            "REFUND_APPROVAL_THRESHOLD_CENTS": str(10**9),
            # the naive group relies on q2 redelivery: keep its retry window short (a
            # delivery's task takes well under a second; a doorbell's hand-over returns at once)
            "Q_TIMEOUT": "5",
            "Q_RETRY": "6",
            # the idle poll finds the redelivered task (a lapsed lock rings no NOTIFY); 0.1 is
            # the product's default, 0.05 spent twice the CPU on every idle pusher
            "Q_POLL": "0.1",
            "LOG_LEVEL": "WARNING",
        }
    )
    db = connection.settings_dict  # the database this process uses (under pytest: the test one)
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = str(db["NAME"])
    else:
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        env["DATABASE_URL"] = (
            f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Process:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = open(log, "ab")
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)
        self.log.close()


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ the experiment
@dataclass
class Row:
    group: str
    fault: str
    run_id: str
    step_id: str
    attempt: int
    tool: str
    operation_key: str
    step_status: str
    refunds_executed: int
    final_status: str
    seconds: float


def _lab_order(n: int) -> Order:
    order_id = f"ORD-{random.randint(10**7, 10**8 - 1)}"
    order = Order.objects.create(
        order_id=order_id,
        customer_name=f"Lab Customer {n}",
        customer_email=f"lab{n}@example.com",
        amount_cents=1000 + 100 * n,
        item="lab item",
    )
    Ticket.objects.create(ticket_id=f"T-{order_id}", order=order, subject="lab", body="lab")
    return order


def run_lab(workdir: Path, timeout: float = 90, log=print) -> list[Row]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    gateway = f"http://127.0.0.1:{port}/gateway"
    web = Process(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ],
        _env(),
        workdir / "web.log",
    )
    rows: list[Row] = []
    try:
        if not _wait(lambda: _reachable(gateway), 30):
            raise RuntimeError("the gateway server did not start; see " + str(workdir / "web.log"))
        for n, (fault, point) in enumerate(FAULTS.items()):
            worker = Process(
                [sys.executable, "manage.py", "qcluster"],
                _env(
                    AGENTRUNS_FAILPOINTS=f"{point}=crash_once",
                    AGENTRUNS_FAILPOINT_DIR=workdir / f"failpoints-{fault}",
                    REFUND_GATEWAY_URL=gateway,
                ),
                workdir / f"worker-{fault}.log",
            )
            try:
                for group in ("A", "B"):
                    log(f"  {group} / {fault} ...")
                    rows.append(
                        _scenario(
                            group, fault, _lab_order(n * 2 + (group == "B")), gateway, timeout
                        )
                    )
            finally:
                worker.kill()
    finally:
        web.kill()
    return rows


def _reachable(url: str) -> bool:
    try:
        httpx.get(url + "/refunds?order_id=none", timeout=1)
        return True
    except httpx.HTTPError:
        return False


def _scenario(group: str, fault: str, order: Order, gateway: str, timeout: float) -> Row:
    """One turn (A) or run (B) on the fault point's cluster, to its end: its row."""
    started = time.monotonic()
    message = "The item arrived broken, please refund."
    if group == "A":
        from django_q.tasks import async_task

        lab_id = str(uuid.uuid4())
        async_task("support.crashlab.naive_turn", lab_id, order.order_id, message, gateway)
        done = _wait(lambda: OutboxMessage.objects.filter(run_id=lab_id).exists(), timeout)
        refunds = GatewayRefund.objects.filter(order_id=order.order_id).order_by("id")
        return Row(
            group="A",
            fault=fault,
            run_id=lab_id,
            step_id="-",
            attempt=refunds.count() or 1,
            tool="issue_refund",
            operation_key=", ".join(r.idempotency_key[:18] for r in refunds) or "-",
            step_status="(no step records)",
            refunds_executed=refunds.count(),
            final_status="succeeded" if done else "incomplete",
            seconds=time.monotonic() - started,
        )
    from agentruns.services import start_run

    run = start_run("refund", {"order_id": order.order_id, "message": message}).run
    _wait(
        lambda: Run.objects.filter(
            id=run.id, status__in=["succeeded", "failed", "waiting", "cancelled"]
        ).exists(),
        timeout,
    )
    run.refresh_from_db()
    step = Step.objects.filter(run=run, tool="issue_refund").first()
    return Row(
        group="B",
        fault=fault,
        run_id=str(run.id),
        step_id=str(step.id) if step else "-",
        attempt=step.attempts if step else 0,
        tool="issue_refund",
        operation_key=step.idempotency_key if step else "-",
        step_status=step.status if step else "-",
        refunds_executed=GatewayRefund.objects.filter(order_id=order.order_id).count(),
        final_status=run.status,
        seconds=time.monotonic() - started,
    )


def verdict(rows: list[Row]) -> tuple[bool, list[str]]:
    problems = []
    for row in rows:
        if row.group == "B" and row.refunds_executed != 1:
            problems.append(
                f"B/{row.fault}: {row.refunds_executed} refunds executed (must be exactly 1)"
            )
        if row.group == "B" and row.final_status != "succeeded":
            problems.append(f"B/{row.fault}: run ended {row.final_status}")
    return not problems, problems


def as_json(rows: list[Row]) -> str:
    ok, problems = verdict(rows)
    return json.dumps({"rows": [asdict(r) for r in rows], "ok": ok, "problems": problems}, indent=2)
