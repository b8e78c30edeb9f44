"""The same Pydantic AI agent as ours, made durable by DBOS instead (`DBOSDurability`, issue
32), and with no durability at all (issue 43).

Ours runs `bench-refund` (benchmarks/workload.py): a Pydantic AI agent built from our `@tool`
declarations, instructions "Refund the order.", its model the offline `scripted` model playing
`flow_policy`. The peer is that agent as an engineer would bring it to DBOS:
`pydantic_ai.Agent(..., capabilities=[DBOSDurability()])`, `agent.run()` inside a
`@DBOS.workflow`, on the same PostgreSQL (DBOS's system database):

- the model: a `FunctionModel` playing the same `flow_policy` through the same conversion our
  scripted model makes (`scripted_model.engine_messages`), waiting `turn_s` before it answers in
  the latency-bound workload (as SCRIPTED_MODEL_LATENCY_MS makes ours wait); each request is a
  DBOS step (`DBOSDurability` routes model requests through steps);
- the tools: the same three statements (benchmarks/peers.py, the SQL every system runs), each a
  `@DBOS.step` (DBOS leaves function tools as workflow code; a tool with I/O is made a step, as
  its documentation says), the refund's key derived from the workflow and the step.

Seven DBOS steps per run, as ours has seven Steps. `DBOSAgentPeer` is the in-process,
sequential, zero-latency peer of `benchmarks.run`; `dbos_agent_peer` the queued, latency-bound
one of `benchmarks.peers_inflight`.

`BareAgentPeer` (`benchmarks.run`) is the same agent, the same model function and the same three
tools running the same statements, with no capability: plain `agent.run()`, nothing persisted
but what the tools write. It is the framework's own floor for this flow: what a durable engine
around the same agent adds is measured against it. All need Django set up (the policy lives with
the workload).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg

from benchmarks.peers import lookup, refund, reply

AGENT_NAME = "bench_dbos_agent"
INSTRUCTIONS = "Refund the order."  # bench-refund's


def script_model(turn_s: float, tokens: int = 0) -> Any:
    """A FunctionModel that plays bench-refund's `flow_policy`, as our scripted model does;
    each turn waits `turn_s` first (in `tokens` waits when given, like the other peers: they
    have no durable stream, so they only wait for the tokens)."""
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    from agentruns.runtime.providers.scripted_model import Playing, engine_messages
    from benchmarks.workload import flow_policy

    playing = Playing(policy=flow_policy, instructions=INSTRUCTIONS)

    async def play(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for _ in range(tokens or (1 if turn_s else 0)):
            await asyncio.sleep(turn_s / (tokens or 1))  # a real model's time to answer
        converted = engine_messages(messages, playing)
        turn = flow_policy(converted)
        parts: list[TextPart | ToolCallPart] = [TextPart(turn.text)]
        for i, (name, args) in enumerate(turn.tool_calls):
            parts.append(
                ToolCallPart(name, json.dumps(args), tool_call_id=f"call_{len(converted)}_{i}")
            )
        return ModelResponse(parts=parts, usage=RequestUsage(output_tokens=1))

    return FunctionModel(play, model_name="scripted")


def _agent(
    cursor: Callable[[], AbstractContextManager[psycopg.Cursor]],
    model: Any,
    capabilities: list[Any],
    step: Callable[[str], Callable[[Callable], Callable]],
    refund_key: Callable[[], str],
) -> Any:
    """The agent and its three tools doing the statements every system runs, on `cursor()`;
    `step(name)` wraps each tool (DBOS: a step), `refund_key()` names the refund's key."""
    from pydantic_ai import Agent

    agent = Agent(model, name=AGENT_NAME, instructions=INSTRUCTIONS, capabilities=capabilities)

    @agent.tool_plain(name="bench_lookup")
    @step("bench_lookup")
    def bench_lookup(order_id: str) -> dict:
        with cursor() as cur:
            return {"order_id": order_id, "amount_cents": lookup(cur, order_id)}

    @agent.tool_plain(name="bench_refund")
    @step("bench_refund")
    def bench_refund(order_id: str, amount_cents: int) -> dict:
        key = refund_key()
        with cursor() as cur:
            refund(cur, order_id, amount_cents, key)
        return {"refunded": amount_cents}

    @agent.tool_plain(name="bench_reply")
    @step("bench_reply")
    def bench_reply(order_id: str, message: str) -> dict:
        with cursor() as cur:
            reply(cur, order_id, str(uuid.uuid4()))
        return {"sent": True}

    return agent


def bare_agent(cursor: Callable[[], AbstractContextManager[psycopg.Cursor]]) -> Any:
    """The agent with no durability at all: no capability, its tools plain functions, the
    refund's key new at every call (nothing would run it again)."""
    return _agent(
        cursor, script_model(0.0), [], lambda name: lambda fn: fn, lambda: f"bare-{uuid.uuid4()}"
    )


def refund_agent(
    cursor: Callable[[], AbstractContextManager[psycopg.Cursor]], turn_s: float, tokens: int = 0
):
    """The agent on DBOSDurability, its tools DBOS steps, `agent.run()` in a DBOS workflow."""
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    agent = _agent(
        cursor,
        script_model(turn_s, tokens),
        [DBOSDurability()],
        lambda name: DBOS.step(name=f"{AGENT_NAME}.{name}"),
        lambda: f"dbos-agent-{DBOS.workflow_id}-{DBOS.step_id}",  # stable across recovery
    )

    @DBOS.workflow(name="bench_dbos_agent.refund")
    async def refund_workflow(order_id: str) -> str:
        result = await agent.run(json.dumps({"order_id": order_id}, sort_keys=True))
        return result.output

    return refund_workflow


def launch(dsn: str, app: str, **config: Any) -> None:
    """DBOS on `dsn` as its system database (one DBOS per process: a second peer shares it)."""
    from dbos import DBOS

    instance = DBOS(
        config={"name": app, "system_database_url": dsn, "log_level": "WARNING", **config}
    )
    if not instance._launched:  # DBOS warns on a second launch; there is no public "launched?"
        DBOS.launch()


class DBOSAgentPeer:
    """In process, one run after another, zero model latency (`benchmarks.run`)."""

    name = "Pydantic AI agent + DBOSDurability"

    def __init__(self, dsn: str) -> None:
        from dbos import DBOS

        self.conn = psycopg.connect(dsn, autocommit=True)

        @contextmanager
        def cursor() -> Iterator[psycopg.Cursor]:
            with self.conn.cursor() as cur:
                yield cur

        self.workflow = refund_agent(cursor, 0.0)
        launch(dsn, "bench")
        self.loop = asyncio.new_event_loop()  # one loop for every run, as ours keeps its thread's
        self.DBOS = DBOS

    def run(self, order_id: str) -> None:
        assert self.loop.run_until_complete(self.workflow(order_id)) == "Done."

    def close(self) -> None:
        self.DBOS.destroy()
        self.loop.close()
        self.conn.close()


class BareAgentPeer:
    """The same agent with no durability (`bare_agent`): plain `agent.run()` on one event loop,
    in process, one run after another, zero model latency (`benchmarks.run`): the framework's
    floor for this flow, with the same SQL statements as every other system."""

    name = "Pydantic AI agent, no durability"

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

        @contextmanager
        def cursor() -> Iterator[psycopg.Cursor]:
            with self.conn.cursor() as cur:
                yield cur

        self.agent = bare_agent(cursor)
        self.loop = asyncio.new_event_loop()

    def run(self, order_id: str) -> None:
        prompt = json.dumps({"order_id": order_id}, sort_keys=True)
        assert self.loop.run_until_complete(self.agent.run(prompt)).output == "Done."

    def close(self) -> None:
        self.loop.close()
        self.conn.close()


def dbos_agent_peer(
    dsn: str, turn_s: float, concurrency: int, pool_size: int, tokens: int = 0
) -> Callable[[list[str]], None]:
    """Queued, many in flight (`benchmarks.peers_inflight`): the agent's workflow enqueued on a
    DBOS queue with `worker_concurrency` = ours in flight, its tools on a pool as large as ours."""
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from concurrent.futures import ThreadPoolExecutor

    from dbos import DBOS

    from benchmarks.peers_inflight import CLIENTS, tools_pool
    from benchmarks.sampling import with_app

    app = "bench-peer-dbos-agent"
    pool = tools_pool(dsn, app, pool_size)

    @contextmanager
    def cursor() -> Iterator[psycopg.Cursor]:
        with pool.connection() as conn, conn.cursor() as cur:
            yield cur

    workflow = refund_agent(cursor, turn_s, tokens)
    launch(with_app(dsn, app), "bench-inflight-agent", sys_db_pool_size=pool_size)
    queue = DBOS.register_queue(
        "bench-inflight-agent", worker_concurrency=concurrency, polling_interval_sec=0.1
    )

    def run_all(orders: list[str]) -> None:
        with ThreadPoolExecutor(CLIENTS) as clients:
            handles = list(clients.map(lambda o: queue.enqueue(workflow, o), orders))
        for handle in handles:
            assert handle.get_result(polling_interval_sec=0.05) == "Done."  # as our harness polls

    return run_all
