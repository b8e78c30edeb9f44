"""The same seven-step refund flow on the floor (raw psycopg), DBOS Transact and LangGraph.

Steps: model -> lookup -> model -> refund -> model -> reply -> model. The "model" is the same
deterministic text the scripted provider returns with no delay; lookup reads the order row,
refund writes the gateway ledger row (ON CONFLICT on the key), reply writes an outbox row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_floor_step (
    run_id uuid NOT NULL, idx int NOT NULL, kind text NOT NULL, payload jsonb NOT NULL,
    PRIMARY KEY (run_id, idx)
);
"""

TEXTS = ["Looking up the order.", "Refunding.", "Replying.", "Done."]


def model_turn(i: int) -> str:
    return TEXTS[i]


def lookup(cur: psycopg.Cursor, order_id: str) -> int:
    cur.execute("SELECT amount_cents FROM support_order WHERE order_id = %s", [order_id])
    return cur.fetchone()[0]


def refund(cur: psycopg.Cursor, order_id: str, amount: int, key: str) -> None:
    cur.execute(
        "INSERT INTO support_gatewayrefund (order_id, amount_cents, reason, idempotency_key, created_at) "
        "VALUES (%s, %s, '', %s, now()) ON CONFLICT (idempotency_key) DO NOTHING",
        [order_id, amount, key],
    )


def reply(cur: psycopg.Cursor, order_id: str, run_id: str) -> None:
    cur.execute(
        'INSERT INTO support_outboxmessage (order_id, "to", body, run_id, sent_by, created_at) '
        "SELECT id, customer_email, 'Refunded.', %s, '', now() FROM support_order "
        "WHERE order_id = %s",
        [run_id, order_id],
    )


# ------------------------------------------------------------------ floor
class Floor:
    """The physical limit of a durable step here: one committed row per step, nothing else."""

    name = "floor (raw psycopg)"

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn)
        with self.conn.transaction():
            self.conn.execute(SCHEMA)

    def run(self, order_id: str) -> None:
        from psycopg.types.json import Jsonb

        run_id = str(uuid.uuid4())
        conn = self.conn
        amount = 0
        for idx in range(7):
            with conn.transaction(), conn.cursor() as cur:
                payload: dict = {}
                if idx % 2 == 0:
                    payload = {"text": model_turn(idx // 2)}
                elif idx == 1:
                    amount = lookup(cur, order_id)
                    payload = {"amount_cents": amount}
                elif idx == 3:
                    refund(cur, order_id, amount, f"floor-{run_id}-3")
                    payload = {"refunded": amount}
                else:
                    reply(cur, order_id, run_id)
                    payload = {"sent": True}
                cur.execute(
                    "INSERT INTO bench_floor_step (run_id, idx, kind, payload) VALUES (%s, %s, %s, %s)",
                    [run_id, idx, "model" if idx % 2 == 0 else "tool", Jsonb(payload)],
                )

    def close(self) -> None:
        self.conn.close()


# ------------------------------------------------------------------ DBOS Transact
class DBOSPeer:
    name = "DBOS Transact"

    def __init__(self, dsn: str) -> None:
        from dbos import DBOS

        self.conn = psycopg.connect(dsn, autocommit=True)
        conn = self.conn

        @DBOS.step()
        def model_step(i: int) -> str:
            return model_turn(i)

        @DBOS.step()
        def lookup_step(order_id: str) -> int:
            with conn.cursor() as cur:
                return lookup(cur, order_id)

        @DBOS.step()
        def refund_step(order_id: str, amount: int) -> int:
            key = f"dbos-{DBOS.workflow_id}-3"  # stable across recovery: derived from the workflow
            with conn.cursor() as cur:
                refund(cur, order_id, amount, key)
            return amount

        @DBOS.step()
        def reply_step(order_id: str) -> bool:
            with conn.cursor() as cur:
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

        DBOS(config={"name": "bench", "system_database_url": dsn, "log_level": "WARNING"})
        DBOS.launch()
        self.flow: Callable[[str], str] = refund_flow
        self.DBOS = DBOS

    def run(self, order_id: str) -> None:
        self.flow(order_id)

    def close(self) -> None:
        self.DBOS.destroy()
        self.conn.close()


# ------------------------------------------------------------------ LangGraph
class LangGraphPeer:
    """`durability="sync"`: each step's checkpoint is persisted before the next step starts, the
    guarantee every system here gives. (LangGraph's default, "async", writes it while the next
    step already runs: a crash can lose it after that step's side effect happened;
    `LangGraphAsyncPeer` measures that mode for reference.)"""

    name = "LangGraph + PostgresSaver"
    durability = "sync"

    def __init__(self, dsn: str) -> None:
        from typing import TypedDict

        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from psycopg.rows import dict_row

        self.saver_conn = psycopg.connect(
            dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver = PostgresSaver(self.saver_conn)
        saver.setup()
        self.conn = psycopg.connect(dsn, autocommit=True)
        conn = self.conn

        class State(TypedDict, total=False):
            order_id: str
            amount: int
            text: str
            thread: str

        def model(i: int):
            return lambda state: {"text": model_turn(i)}

        def lookup_node(state: State) -> dict:
            with conn.cursor() as cur:
                return {"amount": lookup(cur, state["order_id"])}

        def refund_node(state: State) -> dict:
            with conn.cursor() as cur:
                refund(cur, state["order_id"], state["amount"], f"lg-{state['thread']}-3")
            return {}

        def reply_node(state: State) -> dict:
            with conn.cursor() as cur:
                reply(cur, state["order_id"], state["thread"])
            return {}

        graph = StateGraph(State)
        order = [
            ("model0", model(0)),
            ("lookup", lookup_node),
            ("model1", model(1)),
            ("refund", refund_node),
            ("model2", model(2)),
            ("reply", reply_node),
            ("model3", model(3)),
        ]
        for name, fn in order:
            graph.add_node(name, fn)
        graph.add_edge(START, order[0][0])
        for (a, _), (b, _) in zip(order, order[1:], strict=False):
            graph.add_edge(a, b)
        graph.add_edge(order[-1][0], END)
        self.app = graph.compile(checkpointer=saver)

    def run(self, order_id: str) -> None:
        thread = str(uuid.uuid4())
        self.app.invoke(
            {"order_id": order_id, "thread": thread},
            {"configurable": {"thread_id": thread}},
            durability=self.durability,
        )

    def close(self) -> None:
        self.saver_conn.close()
        self.conn.close()


class LangGraphAsyncPeer(LangGraphPeer):
    """LangGraph's default durability: not a durable step (reference only, not a target)."""

    name = "LangGraph, default async checkpoints (reference)"
    durability = "async"
