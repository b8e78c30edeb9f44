"""What the Pydantic AI path costs per step, against the native one, in the in-process engine.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.pydantic_ai_flow \
        --runs 100 --rounds 5

The seven-step refund flow of benchmarks/workload.py (model -> lookup -> model -> refund ->
model -> reply -> model, zero model latency) three ways, alternating in rounds:
- `native`: the registry's @tool functions and the scripted provider (bench-refund);
- `pa-tools`: the same tools as a pydantic_ai.Agent's function tools, the scripted provider;
- `pa-model`: those tools and a streaming Pydantic AI FunctionModel playing the same turns
  (each request through `pydantic_ai.direct.model_request_stream_sync`).
Prints runs/s and ms per step of each (median of the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SCRIPTED_MODEL_DELAY_MS", "0")  # zero model latency, as benchmarks.run

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from pydantic_ai import Agent as PydanticAgent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel  # noqa: E402

from agentruns.registry import current_step, durable, register_agent  # noqa: E402
from agentruns.services import execute_inline  # noqa: E402
from benchmarks import workload  # noqa: E402

STEPS_PER_RUN = 7


def _tools(agent: PydanticAgent, prefix: str) -> None:
    @agent.tool_plain(name=f"{prefix}_lookup")
    def lookup(order_id: str) -> dict:
        with connection.cursor() as cursor:
            cursor.execute("SELECT amount_cents FROM support_order WHERE order_id = %s", [order_id])
            return {"order_id": order_id, "amount_cents": cursor.fetchone()[0]}

    @agent.tool_plain(name=f"{prefix}_refund", metadata=durable(transactional=True))
    def refund(order_id: str, amount_cents: int) -> dict:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO support_gatewayrefund (order_id, amount_cents, reason, "
                "idempotency_key, created_at) VALUES (%s, %s, '', %s, now()) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                [order_id, amount_cents, current_step().idempotency_key],
            )
        return {"refunded": amount_cents}

    @agent.tool_plain(name=f"{prefix}_reply", metadata=durable(transactional=True))
    def reply(order_id: str, message: str) -> dict:
        step = current_step()
        with connection.cursor() as cursor:
            cursor.execute(
                'INSERT INTO support_outboxmessage (order_id, "to", body, run_id, step_id, '
                "sent_by, created_at) SELECT id, customer_email, %s, %s, %s, '', now() "
                "FROM support_order WHERE order_id = %s",
                [message, step.run.id, step.step.id, order_id],
            )
        return {"sent": True}


def _scripted_flow(prefix: str):
    def policy(messages: list[dict]):
        turn = workload.flow_policy(messages)
        turn.tool_calls = [(name.replace("bench", prefix), a) for name, a in turn.tool_calls]
        return turn

    return policy


async def _function_flow(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator:
    order_id = json.loads(messages[0].parts[-1].content)["order_id"]
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    last = messages[-1]
    returns = (
        [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if isinstance(last, ModelRequest)
        else []
    )
    if turn == 0:
        calls = {0: ("Looking up the order.", "pm_lookup", {"order_id": order_id})}
    elif turn == 1:
        amount = returns[0].content["amount_cents"]
        args = {"order_id": order_id, "amount_cents": amount}
        calls = {1: ("Refunding.", "pm_refund", args)}
    else:
        calls = {2: ("Replying.", "pm_reply", {"order_id": order_id, "message": "Refunded."})}
    if turn in calls:
        text, name, args = calls[turn]
        yield text
        yield {0: DeltaToolCall(name=name, json_args=json.dumps(args), tool_call_id=f"c{turn}")}
        return
    yield "Done."


def register() -> None:
    tools_only = PydanticAgent(name="bench-pa-tools")
    _tools(tools_only, "pt")
    register_agent(
        tools_only,
        scripted_policy=_scripted_flow("pt"),
        format_input=lambda run_input: json.dumps(run_input, sort_keys=True),
    )
    with_model = PydanticAgent(FunctionModel(stream_function=_function_flow), name="bench-pa-model")
    _tools(with_model, "pm")
    register_agent(with_model, format_input=lambda run_input: json.dumps(run_input, sort_keys=True))


def measure(agent: str, runs: int) -> float:
    started = time.perf_counter()
    for i in range(runs):
        run_input = {"order_id": f"ORD-{1001 + i % 50}", "message": "refund"}
        run, outcome = execute_inline(agent, run_input)
        if outcome != "succeeded":
            run.refresh_from_db()
            raise AssertionError(f"{agent}: {outcome}: {run.error}")
    return runs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="", help="also write the figures to this file")
    options = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    register()
    agents = {"native": "bench-refund", "pa-tools": "bench-pa-tools", "pa-model": "bench-pa-model"}
    for agent in agents.values():
        measure(agent, 10)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in agents}
    for _ in range(options.rounds):
        for name, agent in agents.items():
            rates[name].append(measure(agent, options.runs))
    figures = {}
    for name, values in rates.items():
        rate = statistics.median(values)
        figures[name] = {"runs_per_s": rate, "ms_per_step": 1000 / rate / STEPS_PER_RUN}
        print(f"{name:9} {rate:7.1f} runs/s  {1000 / rate / STEPS_PER_RUN:6.2f} ms/step")
    if options.json:
        Path(options.json).parent.mkdir(exist_ok=True)
        Path(options.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
