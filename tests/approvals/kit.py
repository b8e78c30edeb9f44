"""The approval tests' own agents and runs: an approval-gated, amount-carrying refund tool, a
lookup that gathers customer facts, and two non-idempotent tools that can "die" mid-call (one of
them approval-gated too); runs parked on them by the real engine, or written in bulk.

The tools register through the public registry, like any app's (tests/testkit.py does the same);
tests/approvals/conftest.py resets their state around every test.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import Agent, Edit, ToolContext, register_agent, tool
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.services import start_run
from approvals.models import Approval, ApprovalKind
from tests.helpers import advance
from tests.testkit import script_policy

CALLS: dict[str, list] = defaultdict(list)
CRASH_NEXT = {"ap_notify": False, "ap_wire": False}  # tool -> "die" inside its next call


def reset() -> None:
    CALLS.clear()
    for name in CRASH_NEXT:
        CRASH_NEXT[name] = False


class SimulatedCrash(BaseException):
    """Escapes the engine's `except Exception` like a SIGKILL would: nothing after it runs."""


@tool
def ap_lookup(ctx: ToolContext, order_id: str) -> dict:
    """Read-only: the facts a human needs (customer, currency)."""
    return {
        "order_id": order_id,
        "customer_name": "Ada Lovelace",
        "currency": "EUR",
        "amount_cents": 4599,
    }


@tool(
    side_effect=True,
    idempotency="key",
    requires_approval=True,
    redact=("card_token",),
    # like the demo's refund: the order is fixed, the amount may only go down
    editable={"amount_cents": Edit.at_most_requested(minimum=1), "reason": Edit.free()},
    amount_arg="amount_cents",
    parameters={
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]+$"},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
            "reason": {"type": "string", "maxLength": 200},
            "card_token": {"type": "string"},
        },
        "required": ["order_id", "amount_cents", "reason"],
        "additionalProperties": False,
    },
)
def ap_refund(
    ctx: ToolContext, order_id: str, amount_cents: int, reason: str, card_token: str = ""
) -> dict:
    """Refund-like side effect that always needs approval."""
    CALLS["ap_refund"].append(
        (
            ctx.idempotency_key,
            {"order_id": order_id, "amount_cents": amount_cents, "card_token": card_token},
        )
    )
    return {"refund_id": f"rf-{len(CALLS['ap_refund'])}", "amount_cents": amount_cents}


@tool(side_effect=True, idempotency="none")
def ap_notify(ctx: ToolContext, to: str, message: str) -> dict:
    """Non-idempotent send; CRASH_NEXT makes the process "die" after the send started."""
    CALLS["ap_notify"].append((ctx.idempotency_key, ctx.attempt, message))
    if CRASH_NEXT["ap_notify"]:
        CRASH_NEXT["ap_notify"] = False
        raise SimulatedCrash("worker died mid-call")
    return {"sent": to}


@tool(side_effect=True, idempotency="none", requires_approval=True, redact=("account",))
def ap_wire(ctx: ToolContext, account: str, amount_cents: int) -> dict:
    """Needs approval and has no idempotency key: an interrupted call must be reconciled."""
    CALLS["ap_wire"].append((ctx.attempt, amount_cents))
    if CRASH_NEXT["ap_wire"]:
        CRASH_NEXT["ap_wire"] = False
        raise SimulatedCrash("worker died mid-call")
    return {"wired": amount_cents}


@tool(
    side_effect=True,
    idempotency="key",
    requires_approval=True,
    # a hold on an order may be made longer, never shorter, and at most 30 days
    editable={"days": Edit.at_least_requested(maximum=30)},
    parameters={
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 365},
        },
        "required": ["order_id", "days"],
        "additionalProperties": False,
    },
)
def ap_hold(ctx: ToolContext, order_id: str, days: int) -> dict:
    """Holds an order's payout for `days`: an approval-gated side effect whose number may only
    be raised."""
    CALLS["ap_hold"].append((order_id, days))
    return {"held_days": days}


register_agent(
    Agent(name="ap-hold", instructions="Hold.", tools=["ap_hold"], scripted_policy=script_policy)
)
register_agent(
    Agent(
        name="ap-script",
        instructions="Follow the script.",
        tools=["ap_lookup", "ap_refund", "ap_notify"],
        scripted_policy=script_policy,
    )
)
register_agent(
    Agent(name="ap-wire", instructions="Wire.", tools=["ap_wire"], scripted_policy=script_policy)
)

SECRET = "tok_live_SECRET123"


def refund_script(amount: int = 4599, reason: str = "The blender arrived broken") -> list[dict]:
    return [
        {
            "text": "Let me look up order ORD-1001 first.",
            "calls": [["ap_lookup", {"order_id": "ORD-1001"}]],
        },
        {
            "text": "The customer is owed 45.99 EUR, so I will issue that refund.",
            "calls": [
                [
                    "ap_refund",
                    {
                        "order_id": "ORD-1001",
                        "amount_cents": amount,
                        "reason": reason,
                        "card_token": SECRET,
                    },
                ]
            ],
        },
        {"text": "Refund handled."},
    ]


def parked_approval(
    amount: int = 4599, reason: str = "The blender arrived broken", message: str = "please refund"
) -> Approval:
    """A real run, driven by the real engine until it parks on ap_refund."""
    run = start_run("ap-script", {"script": refund_script(amount, reason), "message": message}).run
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.select_related("run", "step").get(run=run, kind=ApprovalKind.APPROVAL)


def die_mid_call_then_recover(run: Run) -> Run:
    """Advance `run` until a tool told by CRASH_NEXT "dies" inside its call; then the dead
    worker's lease runs out and the next executor recovers the step by its class."""
    with pytest.raises(SimulatedCrash):
        RunExecutor(run.id).advance()
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return advance(run)


def unknown_step_approval(message: str = "your refund is on its way") -> Approval:
    """A real run whose non-idempotent step died mid-call and went to reconciliation."""
    run = start_run(
        "ap-script",
        {
            "script": [
                {
                    "text": "Telling the customer.",
                    "calls": [["ap_notify", {"to": "ada@example.com", "message": message}]],
                },
                {"text": "All done."},
            ]
        },
    ).run
    CRASH_NEXT["ap_notify"] = True
    run = die_mid_call_then_recover(run)
    assert run.status == RunStatus.WAITING
    return Approval.objects.select_related("run", "step").get(
        run=run, kind=ApprovalKind.RECONCILIATION
    )


def bulk_pending(
    n: int,
    *,
    agent: str = "ap-script",
    kind: str = ApprovalKind.APPROVAL,
    age: timedelta = timedelta(0),
) -> list[Approval]:
    """n parked runs written directly (the engine would take minutes for 10,000): each has a
    model step with text, a lookup result with customer facts and a waiting refund step."""
    now = timezone.now() - age
    snapshot = {"ap_refund": {"side_effect": True, "idempotency": "key", "redact": ["card_token"]}}
    runs, steps, approvals = [], [], []
    for i in range(n):
        run = Run(
            agent=agent,
            input={"message": f"refund please #{i}"},
            status=RunStatus.WAITING,
            tool_snapshot=snapshot,
            step_count=3,
        )
        runs.append(run)
        args = {
            "order_id": f"ORD-{2000 + i}",
            "amount_cents": 1000 + i,
            "reason": f"broken #{i}",
            "card_token": SECRET,
        }
        steps += [
            Step(
                run=run,
                index=0,
                kind="model",
                text=f"Looking up ORD-{2000 + i}.",
                status=StepStatus.SUCCEEDED,
                idempotency_key=uuid.uuid4().hex,
            ),
            Step(
                run=run,
                index=1,
                kind="tool",
                tool="ap_lookup",
                status=StepStatus.SUCCEEDED,
                idempotency_key=uuid.uuid4().hex,
                result={"customer_name": f"Customer {i}", "currency": "EUR"},
            ),
            Step(
                run=run,
                index=2,
                kind="tool",
                tool="ap_refund",
                arguments=args,
                status=StepStatus.WAITING_APPROVAL
                if kind == ApprovalKind.APPROVAL
                else StepStatus.UNKNOWN,
                idempotency_key=uuid.uuid4().hex,
            ),
        ]
    Run.objects.bulk_create(runs, batch_size=2000)
    Step.objects.bulk_create(steps, batch_size=2000)
    for i, run in enumerate(runs):
        approvals.append(
            Approval(
                step=steps[3 * i + 2],
                run=run,
                kind=kind,
                agent=agent,
                tool="ap_refund",
                requested_args=steps[3 * i + 2].arguments,
            )
        )
    Approval.objects.bulk_create(approvals, batch_size=2000)
    if age:
        Approval.objects.filter(id__in=[a.id for a in approvals]).update(created_at=now)
    return approvals


def login(client: Client, user) -> Client:
    client.force_login(user)
    return client
