"""The benchmark workload: the three-step refund flow, gateway in the same database.

Seven durable steps per run: model -> lookup_order -> model -> refund -> model -> reply -> model.
Registered through the public registry like any app's agent (imported by the harness only).
"""

from __future__ import annotations

import json

from django.db import connection

from agentruns.registry import Agent, ScriptedTurn, ToolContext, register_agent, tool
from support.models import Order


@tool(name="bench_lookup")
def bench_lookup(ctx: ToolContext, order_id: str) -> dict:
    # the same statement the peers run (benchmarks/peers.py `lookup`)
    with connection.cursor() as cursor:
        cursor.execute("SELECT amount_cents FROM support_order WHERE order_id = %s", [order_id])
        row = cursor.fetchone()
    if row is None:
        raise Order.DoesNotExist(order_id)
    return {"order_id": order_id, "amount_cents": row[0]}


@tool(name="bench_refund", transactional=True)
def bench_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
    # the gateway's ledger, in the same database: at most one refund per key
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO support_gatewayrefund (order_id, amount_cents, reason, idempotency_key, created_at) "
            "VALUES (%s, %s, '', %s, now()) ON CONFLICT (idempotency_key) DO NOTHING",
            [order_id, amount_cents, ctx.idempotency_key],
        )
    return {"refunded": amount_cents}


@tool(name="bench_reply", transactional=True)
def bench_reply(ctx: ToolContext, order_id: str, message: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO support_outboxmessage (order_id, "to", body, run_id, step_id, sent_by, '
            "created_at) SELECT id, customer_email, %s, %s, %s, '', now() FROM support_order "
            "WHERE order_id = %s",
            [message, ctx.run.id, ctx.step.id, order_id],
        )
    return {"sent": True}


def flow_policy(messages: list[dict]) -> ScriptedTurn:
    order_id = json.loads(messages[1]["content"])["order_id"]
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return ScriptedTurn("Looking up the order.", [("bench_lookup", {"order_id": order_id})])
    if turn == 1:
        amount = json.loads(messages[-1]["content"])["amount_cents"]
        return ScriptedTurn(
            "Refunding.", [("bench_refund", {"order_id": order_id, "amount_cents": amount})]
        )
    if turn == 2:
        return ScriptedTurn(
            "Replying.", [("bench_reply", {"order_id": order_id, "message": "Refunded."})]
        )
    return ScriptedTurn("Done.")


def long_policy(messages: list[dict]) -> ScriptedTurn:
    """Runs of a given length: one echo step per model turn until `steps` is reached."""
    target = json.loads(messages[1]["content"])["steps"]
    if len(messages) - 2 >= target - 1:
        return ScriptedTurn("Done.")
    return ScriptedTurn("Next.", [("bench_lookup", {"order_id": "ORD-1001"})])


register_agent(
    Agent(
        name="bench-refund",
        instructions="Refund the order.",
        tools=["bench_lookup", "bench_refund", "bench_reply"],
        scripted_policy=flow_policy,
    )
)
# the same flow, one run per order at a time (benchmarks/concurrency_keys.py)
register_agent(
    Agent(
        name="bench-refund-keyed",
        instructions="Refund the order.",
        tools=["bench_lookup", "bench_refund", "bench_reply"],
        scripted_policy=flow_policy,
    ),
    concurrency_key=lambda run_input: run_input["order_id"],
    concurrency=1,
)
STREAM_TOKENS_PER_TURN = 25  # at 20 ms a token (50 a second), a 0.5 s turn like the sleeping one


def stream_policy(messages: list[dict]) -> ScriptedTurn:
    """The refund flow, every turn's text STREAM_TOKENS_PER_TURN tokens long: with
    SCRIPTED_MODEL_DELAY_MS=20 the model streams 50 tokens a second per run."""
    turn = flow_policy(messages)
    words = turn.text.split()
    filler = ["(checking", "the", "order", "and", "the", "policy", "before", "answering)"]
    while len(words) < STREAM_TOKENS_PER_TURN:
        words.append(filler[len(words) % len(filler)])
    return ScriptedTurn(" ".join(words), turn.tool_calls)


register_agent(
    Agent(
        name="bench-stream",
        instructions="Refund the order.",
        tools=["bench_lookup", "bench_refund", "bench_reply"],
        scripted_policy=stream_policy,
    )
)
register_agent(
    Agent(
        name="bench-long",
        instructions="Keep going.",
        tools=["bench_lookup"],
        scripted_policy=long_policy,
        max_steps=5000,
    )
)


@tool(name="bench_sleep", side_effect=True, idempotency="key")
def bench_sleep(ctx: ToolContext) -> dict:
    """A long call for the recovery benchmark: the worker is killed while it sleeps."""
    import os
    import time

    if ctx.attempt == 1:  # the attempt that gets killed; the recovered one returns at once
        time.sleep(float(os.environ.get("BENCH_SLOW_TOOL_SECONDS", "0.1")))
    return {"slept": True}


def slow_policy(messages: list[dict]) -> ScriptedTurn:
    if any(m["role"] == "tool" for m in messages):
        return ScriptedTurn("Done.")
    return ScriptedTurn("Sleeping.", [("bench_sleep", {})])


register_agent(
    Agent(
        name="bench-slow", instructions="Sleep.", tools=["bench_sleep"], scripted_policy=slow_policy
    )
)
