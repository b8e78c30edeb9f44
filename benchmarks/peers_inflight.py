"""The peers with many runs in flight: the seven-step refund flow of `benchmarks/peers.py`, each
model step waiting TURN_MS like a real model, N runs started together.

- DBOS Transact: workflows enqueued on a DBOS queue with `worker_concurrency` = ours in flight;
- the same Pydantic AI agent as ours on `DBOSDurability` (`benchmarks/peers_agent.py`): its
  workflow enqueued on such a queue;
- LangGraph + PostgresSaver: `invoke` on a thread pool of the same size, `durability="sync"`.
Both get a psycopg pool for their own database work (the checkpointer's, the tools') as large as
the pools of our two worker processes together. Run in a process of its own (DBOS keeps
background threads, and the RSS measured is this process's):

    python -m benchmarks.peers_inflight dbos|dbos-agent|langgraph DSN N[,N...] TURN_MS CONCURRENCY POOL [TOKENS]

prints one JSON object per N. TOKENS (the streaming workload): a model turn is TOKENS tokens
TURN_MS / TOKENS apart instead of one wait of TURN_MS. The peers have no durable stream, so
their tokens are only waited for, never written: the streaming workload costs them nothing
more than the sleeping one, while ours persists the deltas (DESIGN 5).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool

from benchmarks.peers import lookup, model_turn, refund, reply
from benchmarks.sampling import Sampler, with_app

CLIENTS = 8  # concurrent clients starting the runs, as for ours


def tools_pool(dsn: str, app: str, size: int, **kwargs: object) -> ConnectionPool:
    return ConnectionPool(
        with_app(dsn, app),
        min_size=1,
        max_size=size,
        kwargs={"autocommit": True, **kwargs},
        open=True,
    )


def model_wait(turn_s: float, tokens: int) -> None:
    """A model turn: one wait, or `tokens` tokens streamed over the same time."""
    if not tokens:
        time.sleep(turn_s)
        return
    for _ in range(tokens):
        time.sleep(turn_s / tokens)


def dbos_peer(
    dsn: str, turn_s: float, concurrency: int, pool_size: int, tokens: int = 0
) -> Callable:
    from dbos import DBOS

    app = "bench-peer-dbos"
    pool = tools_pool(dsn, app, pool_size)

    @DBOS.step()
    def model_step(i: int) -> str:
        model_wait(turn_s, tokens)
        return model_turn(i)

    @DBOS.step()
    def lookup_step(order_id: str) -> int:
        with pool.connection() as conn, conn.cursor() as cur:
            return lookup(cur, order_id)

    @DBOS.step()
    def refund_step(order_id: str, amount: int) -> int:
        with pool.connection() as conn, conn.cursor() as cur:
            refund(cur, order_id, amount, f"dbos-{DBOS.workflow_id}-3")
        return amount

    @DBOS.step()
    def reply_step(order_id: str) -> bool:
        with pool.connection() as conn, conn.cursor() as cur:
            reply(cur, order_id, str(uuid.uuid4()))
        return True

    @DBOS.workflow()
    def refund_flow(order_id: str) -> str:
        model_step(0)
        amount = lookup_step(order_id)
        model_step(1)
        refund_step(order_id, amount)
        model_step(2)
        reply_step(order_id)
        return model_step(3)

    DBOS(
        config={
            "name": "bench-inflight",
            "system_database_url": with_app(dsn, app),
            "log_level": "WARNING",
            "sys_db_pool_size": pool_size,
        }
    )
    DBOS.launch()
    queue = DBOS.register_queue(
        "bench-inflight", worker_concurrency=concurrency, polling_interval_sec=0.1
    )

    def run_all(orders: list[str]) -> None:
        with ThreadPoolExecutor(CLIENTS) as clients:
            handles = list(clients.map(lambda o: queue.enqueue(refund_flow, o), orders))
        for handle in handles:
            handle.get_result(polling_interval_sec=0.05)  # as our harness polls

    return run_all


def langgraph_peer(
    dsn: str, turn_s: float, concurrency: int, pool_size: int, tokens: int = 0
) -> Callable:
    from typing import TypedDict

    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    # PostgresSaver reads rows as dicts; the tools ask their cursors for tuples
    pool = tools_pool(
        dsn, "bench-peer-langgraph", pool_size, prepare_threshold=0, row_factory=dict_row
    )
    saver = PostgresSaver(pool)
    saver.setup()

    class State(TypedDict, total=False):
        order_id: str
        amount: int
        text: str
        thread: str

    def model(i: int) -> Callable:
        def node(state: State) -> dict:
            model_wait(turn_s, tokens)
            return {"text": model_turn(i)}

        return node

    def db(fn: Callable) -> Callable:
        def node(state: State) -> dict:
            with pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                return fn(cur, state) or {}

        return node

    order = [
        ("model0", model(0)),
        ("lookup", db(lambda cur, s: {"amount": lookup(cur, s["order_id"])})),
        ("model1", model(1)),
        ("refund", db(lambda cur, s: refund(cur, s["order_id"], s["amount"], f"lg-{s['thread']}"))),
        ("model2", model(2)),
        ("reply", db(lambda cur, s: reply(cur, s["order_id"], s["thread"]))),
        ("model3", model(3)),
    ]
    graph = StateGraph(State)
    for name, fn in order:
        graph.add_node(name, fn)
    graph.add_edge(START, order[0][0])
    for (a, _), (b, _) in zip(order, order[1:], strict=False):
        graph.add_edge(a, b)
    graph.add_edge(order[-1][0], END)
    app = graph.compile(checkpointer=saver)
    executor = ThreadPoolExecutor(concurrency)

    def invoke(order_id: str) -> None:
        thread = str(uuid.uuid4())
        app.invoke(
            {"order_id": order_id, "thread": thread},
            {"configurable": {"thread_id": thread}},
            durability="sync",
        )

    def run_all(orders: list[str]) -> None:
        for future in [executor.submit(invoke, o) for o in orders]:
            future.result()

    return run_all


def main() -> None:
    peer, dsn, ns, turn_ms, concurrency, pool_size = sys.argv[1:7]
    tokens = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    from benchmarks.peers_agent import dbos_agent_peer

    build = {"dbos": dbos_peer, "dbos-agent": dbos_agent_peer, "langgraph": langgraph_peer}[peer]
    run_all = build(dsn, float(turn_ms) / 1000, int(concurrency), int(pool_size), tokens)
    sampler = Sampler(dsn, f"bench-peer-{peer}", [os.getpid()])
    sampler.start()
    run_all([f"ORD-{1001 + i}" for i in range(4)])  # warm up: connections, imports, plans
    for n in (int(x) for x in ns.split(",")):
        time.sleep(1)
        sampler.reset()
        baseline = sampler.peak()[0] or 0.0
        time.sleep(0.2)
        baseline = sampler.peak()[0] or baseline
        started = time.perf_counter()
        run_all([f"ORD-{1001 + i % 250}" for i in range(n)])
        wall = time.perf_counter() - started
        rss, connections = sampler.peak()
        print(
            json.dumps(
                {
                    "n": n,
                    "wall_s": wall,
                    "rss_mb": rss,
                    "rss_growth_mb": rss - baseline,
                    "pg_connections": connections,
                }
            ),
            flush=True,
        )
    sampler.stop()
    os._exit(0)  # DBOS's background threads would keep the process alive


if __name__ == "__main__":
    main()
