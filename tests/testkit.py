"""Agents and tools the tests share, registered through the public registry like any app's.

The `script` agent plays the turns listed in its input: {"script": [{"text": ..., "calls":
[[tool, args], ...]}, ...]}; turn i is played when the conversation holds i assistant messages.
The `ops-script` and `ops-other` agents add the run-operations tools (`ops_lookup` with secrets
to redact, `ops_ship` that fails on demand) and search fields, for the pages and the API; at the
end, the runs on them that tests in several directories start from. Tools, agents and runs only
one directory uses live in that directory's `kit.py`.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone

from agentruns.models import Run, RunStatus
from agentruns.registry import (
    Agent,
    Edit,
    FatalToolError,
    RetryableToolError,
    RetryPolicy,
    ScriptedTurn,
    ToolContext,
    register_agent,
    tool,
)
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.execution import failpoints
from agentruns.services import start_run
from approvals import services as decisions
from support.ledger import refund_context, refund_key, refund_limit
from support.models import GatewayRefund
from tests.helpers import advance, script_run

CALLS: dict[str, list] = defaultdict(list)  # tool name -> [(key, attempt, args)]
FAILS: dict[str, int] = defaultdict(int)  # tool name -> transient failures still to produce
# tool name -> a callable(name, ctx) run inside the call (what a library would do there)
HOOKS: dict[str, Callable[[str, ToolContext], None]] = {}
GATE = threading.Event()
GATE.set()
LOCK = threading.Lock()


def reset() -> None:
    CALLS.clear()
    FAILS.clear()
    HOOKS.clear()
    GATE.set()


def _record(name: str, ctx: ToolContext, args: dict) -> None:
    with LOCK:
        CALLS[name].append((ctx.idempotency_key, ctx.attempt, args))
    hook = HOOKS.get(name)
    if hook is not None:
        hook(name, ctx)


@tool
def t_echo(ctx: ToolContext, text: str, times: int = 1) -> dict:
    """Read-only: echo text."""
    _record("t_echo", ctx, {"text": text})
    return {"echo": text * times}


@tool(
    side_effect=True,
    idempotency="key",
    retry=RetryPolicy(max_attempts=3, backoff_seconds=0.01, jitter=0),
)
def t_charge(ctx: ToolContext, amount: int) -> dict:
    """Side effect with an idempotency key; fails transiently FAILS['t_charge'] times."""
    _record("t_charge", ctx, {"amount": amount})
    GATE.wait(10)
    if FAILS["t_charge"] > 0:
        FAILS["t_charge"] -= 1
        raise RetryableToolError("temporary outage")
    return {"charged": amount, "key": ctx.idempotency_key}


@tool(side_effect=True, idempotency="none")
def t_email(ctx: ToolContext, to: str) -> dict:
    """Side effect without idempotency."""
    _record("t_email", ctx, {"to": to})
    return {"sent": to}


@tool(side_effect=True, idempotency="key")
def t_explode(ctx: ToolContext) -> dict:
    """Always fails fatally."""
    raise FatalToolError("card declined")


@tool(side_effect=True, idempotency="key", requires_approval=lambda a: a["amount"] > 100)
def t_pay(ctx: ToolContext, amount: int) -> dict:
    """Needs approval above 100."""
    _record("t_pay", ctx, {"amount": amount})
    return {"paid": amount}


def script_policy(messages: list[dict]) -> ScriptedTurn:
    script = json.loads(messages[1]["content"]).get("script", [])
    turn_no = sum(1 for m in messages if m["role"] == "assistant")
    if turn_no >= len(script):
        if script and script[-1].get("loop"):
            turn = script[-1]
        else:
            return ScriptedTurn(text="done")
    else:
        turn = script[turn_no]
    return ScriptedTurn(
        text=turn.get("text", ""), tool_calls=[(c[0], c[1]) for c in turn.get("calls", [])]
    )


@tool(transactional=True, retry=RetryPolicy(max_attempts=3, backoff_seconds=0.01, jitter=0))
def t_tx(ctx: ToolContext, amount: int) -> dict:
    """Writes a ledger row in this database; fails (after writing) FAILS['t_tx'] times."""
    _record("t_tx", ctx, {"amount": amount})
    GatewayRefund.objects.create(
        order_id="ORD-TX", amount_cents=amount, idempotency_key=f"tx-{uuid.uuid4()}"
    )
    if FAILS["t_tx"] > 0:
        FAILS["t_tx"] -= 1
        raise RetryableToolError("failed after writing")
    return {"written": amount}


TOOLS = ["t_echo", "t_charge", "t_email", "t_explode", "t_pay", "t_tx"]

register_agent(
    Agent(
        name="script", instructions="Follow the script.", tools=TOOLS, scripted_policy=script_policy
    )
)
register_agent(
    Agent(
        name="script-budget",
        instructions="Follow the script.",
        tools=TOOLS,
        scripted_policy=script_policy,
        token_budget=60,
    )
)
register_agent(
    Agent(
        name="script-deadline",
        instructions="Follow the script.",
        tools=TOOLS,
        scripted_policy=script_policy,
        deadline_seconds=0.001,
    )
)
register_agent(
    Agent(
        name="script-short",
        instructions="Follow the script.",
        tools=TOOLS,
        scripted_policy=script_policy,
        max_steps=5,
    )
)
register_agent(
    Agent(
        name="script-cost",
        instructions="Follow the script.",
        tools=TOOLS,
        scripted_policy=script_policy,
        max_cost_usd=0.5,
    )
)


@tool(redact=("api_key", "customer_email"))
def ops_lookup(ctx: ToolContext, customer: str, api_key: str) -> dict:
    """Read-only, with secrets in both its arguments and its result."""
    _record("ops_lookup", ctx, {"customer": customer})
    return {"customer": customer, "customer_email": f"{customer}@example.com", "tier": "gold"}


@tool(
    side_effect=True,
    idempotency="key",
    retry=RetryPolicy(max_attempts=2, backoff_seconds=0.01, backoff_max_seconds=0.05, jitter=0.1),
)
def ops_ship(ctx: ToolContext, parcel: str) -> dict:
    """A side effect that fails transiently FAILS['ops_ship'] times, fatally FAILS['ops_ship_fatal']
    times (first)."""
    _record("ops_ship", ctx, {"parcel": parcel})
    if FAILS["ops_ship_fatal"] > 0:
        FAILS["ops_ship_fatal"] -= 1
        raise FatalToolError("carrier rejected the label")
    if FAILS["ops_ship"] > 0:
        FAILS["ops_ship"] -= 1
        raise RetryableToolError("carrier timeout")
    return {"shipped": parcel, "tracking": f"TRK-{ctx.idempotency_key[-6:]}"}


OPS_AGENT = "ops-script"
OPS_TOOLS = [*TOOLS, "ops_lookup", "ops_ship"]

for ops_agent in (OPS_AGENT, "ops-other"):
    register_agent(
        Agent(
            name=ops_agent,
            instructions="Follow the script.",
            tools=OPS_TOOLS,
            scripted_policy=script_policy,
            search_fields=("order_id", "ticket_id"),
        )
    )


# ------------------------------------------------------------------ across runs (issue 30)
class SimulatedCrash(BaseException):
    """Escapes the engine's `except Exception` like a SIGKILL: nothing after it runs."""


def _refund(name: str, ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
    """A refund in the gateway's ledger (GatewayRefund), one per idempotency key as the real
    gateway keeps it; FAILS[name] transient failures first, FAILS[name + "_fatal"] fatal ones,
    and FAILS[name + "_crash"] "deaths" right after the ledger row is written."""
    _record(name, ctx, {"order_id": order_id, "amount_cents": amount_cents})
    GATE.wait(10)
    if FAILS[f"{name}_fatal"] > 0:
        FAILS[f"{name}_fatal"] -= 1
        raise FatalToolError("gateway refused")
    if FAILS[name] > 0:
        FAILS[name] -= 1
        raise RetryableToolError("gateway timeout")
    row, _ = GatewayRefund.objects.get_or_create(
        idempotency_key=ctx.idempotency_key,
        defaults={"order_id": order_id, "amount_cents": amount_cents},
    )
    if FAILS[f"{name}_crash"] > 0:
        FAILS[f"{name}_crash"] -= 1
        raise SimulatedCrash("worker died after the gateway answered")
    return {"refund_id": f"rf_{row.pk}", "amount_cents": amount_cents, "order_id": order_id}


def order_operation_key(args: dict) -> str:
    """One refund per order (the demo's refund is keyed per request, its ticket: these tools keep
    the simpler key the runtime's tests need, `refund:<order_id>`)."""
    return refund_key(args["order_id"])


# declared like the demo's issue_refund, keyed per order: one refund per order, refunds adding
# up to what was paid, the order's refunds as the approver's context (support/ledger.py)
ACROSS_RUNS = {
    "side_effect": True,
    "operation_key": order_operation_key,
    "limit": refund_limit,
    "context": refund_context,
    "amount_arg": "amount_cents",
    "editable": {"amount_cents": Edit.at_most_requested(minimum=1)},
    "retry": RetryPolicy(max_attempts=3, backoff_seconds=0.01, jitter=0),
}


@tool(**ACROSS_RUNS)
def t_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
    """Refund (keyed per order, limited to what was paid), no approval."""
    return _refund("t_refund", ctx, order_id, amount_cents)


@tool(**ACROSS_RUNS, requires_approval=True)
def t_refund_approved(ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
    """The same refund, always approved first."""
    return _refund("t_refund_approved", ctx, order_id, amount_cents)


@tool(**{**ACROSS_RUNS, "idempotency": "none"})
def t_refund_once(ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
    """The same refund through a service without idempotency keys: an interrupted call's
    outcome is unknown (reconciled in the inbox)."""
    return _refund("t_refund_once", ctx, order_id, amount_cents)


KEYED_AGENT = "keyed"
register_agent(
    Agent(
        name=KEYED_AGENT,
        instructions="Follow the script.",
        tools=["t_refund", "t_refund_approved", "t_refund_once", "t_echo"],
        scripted_policy=script_policy,
    )
)


def refund_run(order_id: str, amount_cents: int, tool: str = "t_refund") -> Run:
    """A queued run of the `keyed` agent that refunds `amount_cents` of `order_id` with `tool`,
    then says what the refund answered."""
    call = [tool, {"order_id": order_id, "amount_cents": amount_cents}]
    return script_run([{"calls": [call]}, {"text": "refund handled"}], agent=KEYED_AGENT)


def failed_shipping_run(parcel: str = "P-1", final_text: str = "shipped by hand") -> Run:
    """A run whose `ops_ship` step failed fatally: the run failed, ready to retry or resolve."""
    FAILS["ops_ship_fatal"] = 1
    run = advance(
        script_run(
            [{"calls": [["ops_ship", {"parcel": parcel}]]}, {"text": final_text}], agent=OPS_AGENT
        )
    )
    assert run.status == RunStatus.FAILED
    return run


def succeeded_run_to_fork() -> Run:
    """A succeeded run of five steps: model, t_echo("a"), model, t_charge(2), model ("done")."""
    return advance(
        script_run(
            [
                {"calls": [["t_echo", {"text": "a"}]]},
                {"calls": [["t_charge", {"amount": 2}]]},
                {"text": "done"},
            ],
            agent=OPS_AGENT,
        )
    )


# ------------------------------------------------------------------ the demo's customer replies
# runs of the demo's refund agent that need no gateway: the refund parks (every refund needs
# approval by default) and is rejected, so the agent notes that and mails the customer. Steps:
# 0 model, 1 lookup_order, 2 model, 3 issue_refund (rejected), 4 model (asks for the note and the
# reply), 5 add_ticket_note, 6 send_customer_reply, 7 model
REPLY_TURN, NOTE_STEP, REPLY_STEP = 4, 5, 6


class Cut(BaseException):
    """What `tool_returned:<tool>=crash_once` does to a worker, in this process: the call returned
    and nothing after it runs (it escapes the engine's `except Exception`, as SIGKILL would)."""


def cut_after_call(monkeypatch, name: str) -> None:
    """The failpoint `tool_returned:<name>=crash_once`, in this process: the next call of the tool
    is cut right after it returned (tests/crash runs the real one, which SIGKILLs a worker)."""
    real, fired = failpoints.hit, []

    def hit(point: str, *, tool: str | None = None, step_id: object = None) -> None:
        if point == "tool_returned" and tool == name and not fired:
            fired.append(step_id)
            raise Cut(f"{point}:{name}")
        real(point, tool=tool, step_id=step_id)

    monkeypatch.setattr(failpoints, "hit", hit)


def rejected_refund_run(decider, order_id: str = "ORD-1007", **start) -> Run:
    """A refund run parked on its refund, rejected by `decider`: queued to note and reply."""
    run = start_run(
        "refund", {"order_id": order_id, "message": "It broke, refund please"}, **start
    ).run
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    pending = run.approvals.get(status="pending")
    decisions.reject(pending.id, user=decider, reason="outside the return window")
    return run


def replied_run(decider, **start) -> Run:
    """A finished refund run whose refund was rejected: one note, one mail to the customer."""
    run = advance(rejected_refund_run(decider, **start))
    assert run.status == RunStatus.SUCCEEDED, run.error
    return run


def unknown_reply_run(decider, monkeypatch, **start) -> Run:
    """A refund run whose customer reply was cut after the mail went out (one outbox row): the
    next worker finds the step running, its outcome unknown, and parks the run on a
    reconciliation item."""
    run = rejected_refund_run(decider, **start)
    cut_after_call(monkeypatch, "send_customer_reply")
    try:
        RunExecutor(run.id).advance()
    except Cut:
        pass
    else:
        raise AssertionError("the reply was not cut")
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    return run


def aborted_reply_run(decider, monkeypatch, **start) -> Run:
    """`unknown_reply_run`, whose reconciliation `decider` answered "abort": the run failed."""
    run = unknown_reply_run(decider, monkeypatch, **start)
    item = run.approvals.get(status="pending", kind="reconciliation")
    decisions.reconcile(item.id, user=decider, resolution="abort", reason="cannot tell")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.stop_reason == "aborted"
    return run
