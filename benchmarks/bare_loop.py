"""The floor under a durable run: the demo refund agent's shape as a bare Pydantic AI agent, in
memory, with no durability: its CPU per run is what the agent loop itself costs.

    .venv/bin/python -m benchmarks.bare_loop [--runs 200] [--warmup 30] [--shape JSON]

The shape is that of a demo `refund` run (support/agents.py played by the scripted model,
support/policy.py): four streamed model turns, the first three asking for tools
(lookup_order; issue_refund; add_ticket_note + send_customer_reply), the last only text. The
model is a `FunctionModel` whose `stream_function` yields as many text deltas per turn as the
scripted model streams (one per token of `_TOKEN`), then its tool calls as `DeltaToolCall`s, with
no sleep between deltas: the run is CPU only. The tools have the demo's signatures (the same
argument validation) and return what the demo's return, touching nothing. `agent.run()` streams
each turn because it is given an `event_stream_handler` (which reads every event, as a front end
would), the way a streaming deployment runs the loop.

The figure: this process's CPU time (user + system, `time.process_time`) over `--runs` runs after
`--warmup`, per run; one run at a time, on one event loop. `--shape` (JSON: a list of
`[text deltas, [tool names]]` per turn) plays another shape; `benchmarks.deployment` passes the
one it counted in the real runs. Prints one JSON line.

Beside it, `passthrough_cpu_ms_per_run`: the same agent with `PassThroughDurability`, Pydantic
AI's durable-execution hooks (`BaseDurabilityCapability`: every model request and tool call a
unit, the request streamed inside its unit as our engine streams it) with nothing behind them:
each unit's body runs at once and nothing is recorded. It is what the framework's durability
costs before any engine does its own work, so the engine's share of a run is the worker's CPU
above it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated, Any

import django
from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.durable_exec import (
    BaseDurabilityCapability,
    JournalCallableOperationBackend,
    RoleBasedOperationConfig,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()  # (the engine's spec below is read from its module, which imports the models)

from agentruns.runtime.engine.durability import ENGINE  # noqa: E402
from agentruns.runtime.engine.pydantic_ai_private import open_durable_unit_stream  # noqa: E402

# [text deltas, tool calls] per model turn of a demo refund run (the scripted model's tokens of
# support/policy.py's texts for an order of the seeded demo; `benchmarks.deployment` reports the
# counts it sees and passes them here)
DEMO_SHAPE: list[tuple[int, list[str]]] = [
    (7, ["lookup_order"]),
    (19, ["issue_refund"]),
    (13, ["add_ticket_note", "send_customer_reply"]),
    (11, []),
]
ORDER = {
    "found": True,
    "order_id": "ORD-1001",
    "customer_name": "Alex Example",
    "customer_email": "alex@example.com",
    "amount_cents": 4999,
    "currency": "USD",
    "item": "Wireless headphones",
    "status": "delivered",
    "ticket_id": "T-1001",
}
ARGUMENTS: dict[str, dict[str, Any]] = {
    "lookup_order": {"order_id": "ORD-1001"},
    "issue_refund": {"order_id": "ORD-1001", "amount_cents": 4999, "reason": "customer request"},
    "add_ticket_note": {
        "order_id": "ORD-1001",
        "note": "Refunded $49.99 (rf_0123456789abcdef) at the customer's request.",
    },
    "send_customer_reply": {
        "order_id": "ORD-1001",
        "message": "Hi Alex, we have refunded $49.99 for order ORD-1001. It should appear on "
        "your statement within 5 business days.",
    },
}


class _UnitsRunAtOnce(JournalCallableOperationBackend[Any]):
    async def execute(
        self, *, operation_id: Any, name: str, body: Any, cache_key: Any, config: Any
    ) -> object:
        return await body()


class PassThroughDurability(BaseDurabilityCapability[Any]):
    """Pydantic AI's durable-execution hooks, every unit run at once, nothing recorded (the
    module's docstring)."""

    # the engine's own spec (what is a unit, how results are coded), under another name
    engine_spec = replace(ENGINE, engine_name="passthrough")

    def _bind_to_agent(self, agent: Any) -> None:
        self._backend = _UnitsRunAtOnce(
            agent_name=self.name,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )
        super()._bind_to_agent(agent)

    def get_durable_operation_backend(self) -> _UnitsRunAtOnce:
        return self._backend

    @property
    def in_durable_context(self) -> bool:
        return True

    async def _model_request_operation(self, params: Any) -> ModelResponse:
        """Streamed inside the unit, every event read (as the engine's model unit does)."""
        async with self._durable_model_scope(params.model_id, params.run_context, serving=True) as (
            model,
            ctx,
        ):
            async with open_durable_unit_stream(
                model, params.messages, params.model_settings, params.model_request_parameters, ctx
            ) as streamed:
                async for _ in streamed:
                    pass
            response = streamed.get()
        self._stamp_response(response, params.messages)
        return response


def build_agent(shape: list[tuple[int, list[str]]], capabilities: tuple = ()) -> Agent:
    """The refund agent's shape on a streaming `FunctionModel` that plays `shape`."""

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        # the turn: how many tool results came back so far (as the scripted model reads the
        # conversation for its turn)
        turn = sum(
            1
            for m in messages
            if isinstance(m, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in m.parts)
        )
        deltas, tools = shape[min(turn, len(shape) - 1)]
        for i in range(deltas):
            yield f"word{i} "
        for i, name in enumerate(tools):
            yield {
                i: DeltaToolCall(
                    name=name,
                    json_args=json.dumps(ARGUMENTS.get(name, {})),
                    tool_call_id=f"call_{turn}_{i}",
                )
            }

    agent = Agent(
        FunctionModel(stream_function=stream, model_name="bare"),
        name="refund",
        instructions=(
            "You are a support agent for an online shop. Look up the order, refund the amount "
            "the customer is owed, note it on the ticket and reply to the customer."
        ),
        capabilities=list(capabilities),
    )

    @agent.tool_plain
    def lookup_order(order_id: str) -> dict:
        """Look up an order: customer, amount, currency, item and status."""
        return {**ORDER, "order_id": order_id}

    @agent.tool_plain
    def issue_refund(
        order_id: Annotated[str, Field(pattern="^ORD-[0-9]+$")],
        amount_cents: Annotated[int, Field(ge=1, le=10_000_000)],
        reason: Annotated[str, Field(max_length=500)],
    ) -> dict:
        """Refund an order through the payment gateway."""
        return {
            "refund_id": "rf_0123456789abcdef",
            "amount_cents": amount_cents,
            "order_id": order_id,
        }

    @agent.tool_plain
    def add_ticket_note(order_id: str, note: str) -> dict:
        """Add an internal note to the order's open support ticket."""
        return {"ticket_id": "T-1001", "note_id": 1}

    @agent.tool_plain
    def send_customer_reply(order_id: str, message: str) -> dict:
        """Send a reply to the customer by email."""
        return {"outbox_id": 1, "to": "customer"}

    return agent


async def _events(ctx: Any, events: AsyncIterator[Any]) -> None:
    async for _ in events:  # a front end reads every event of the stream
        pass


async def _runs(agent: Agent, count: int, prompt: str, *, streamed: bool = True) -> None:
    for _ in range(count):
        if streamed:
            await agent.run(prompt, event_stream_handler=_events)
        else:  # (its durability streams each request inside the unit)
            await agent.run(prompt)


def _cpu_per_run(agent: Agent, runs: int, warmup: int, *, streamed: bool) -> tuple[float, float]:
    prompt = json.dumps({"order_id": "ORD-1001", "message": ""})
    asyncio.run(_runs(agent, warmup, prompt, streamed=streamed))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    asyncio.run(_runs(agent, runs, prompt, streamed=streamed))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu * 1000 / runs, wall * 1000 / runs


def measure(
    shape: list[tuple[int, list[str]]] | None = None, runs: int = 200, warmup: int = 30
) -> dict:
    """CPU ms per run of the bare loop playing `shape` (default: the demo's), in this process."""
    shape = shape or DEMO_SHAPE
    cpu, wall = _cpu_per_run(build_agent(shape), runs, warmup, streamed=True)
    passthrough = build_agent(shape, (PassThroughDurability(),))
    passthrough_cpu, _ = _cpu_per_run(passthrough, runs, warmup, streamed=False)
    return {
        "runs": runs,
        "cpu_ms_per_run": round(cpu, 2),
        "wall_ms_per_run": round(wall, 2),
        "passthrough_cpu_ms_per_run": round(passthrough_cpu, 2),
        "model_turns": len(shape),
        "tool_calls": sum(len(tools) for _, tools in shape),
        "text_deltas": sum(d for d, _ in shape),
        "shape": shape,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--shape", help="JSON: [[text deltas, [tool names]], ...] per turn")
    args = parser.parse_args()
    shape = [(int(d), list(t)) for d, t in json.loads(args.shape)] if args.shape else None
    print(json.dumps(measure(shape, args.runs, args.warmup)))


if __name__ == "__main__":
    main()
