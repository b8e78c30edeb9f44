"""Pydantic AI agents of the tests, registered with `register_agent(pydantic_ai.Agent)` like a
user's (AGENTRUNS_AGENT_MODULES=tests.pydantic_ai.agents in worker processes).

Their model is a streaming `FunctionModel` that plays the run's message: a JSON object
{"calls": [[tool, args], ...], "say": "..."}: turn i asks for call i (one per turn), the turn
after the last call answers with what the tools answered. `backoffice()` registers an agent with
the tools of an MCP server (tests/pydantic_ai/mcp_server.py); worker processes get one for the
server at TEST_MCP_URL when the variable is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from django.db import connection
from pydantic_ai import Agent, ApprovalRequired, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from agentruns.registry import Edit, RetryableToolError, current_step, durable, register_agent
from support.agents import gateway_client, gateway_headers
from support.conf import demo_conf
from tests.pydantic_ai.kit import planned


def tool_answers(messages: list[ModelMessage]) -> list[str]:
    """What the tools answered in the last request (returns, denials and retry prompts)."""
    last = messages[-1]
    if not isinstance(last, ModelRequest):
        return []
    return [
        f"{p.tool_name}={p.content}"
        for p in last.parts
        if isinstance(p, ToolReturnPart | RetryPromptPart)
    ]


async def play(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | dict]:
    plan = planned(messages)
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    calls = plan.get("calls", [])
    offered = {t.name for t in info.function_tools}
    if turn < len(calls):
        name, args = calls[turn]
        if name in offered or plan.get("call_unoffered"):
            yield {0: DeltaToolCall(name=name, json_args=json.dumps(args), tool_call_id=f"c{turn}")}
            return
        yield f"I may not use {name}. "
    answers = tool_answers(messages)
    for word in (plan.get("say", "Done.") + " " + " | ".join(answers)).split(" "):
        if plan.get("word_delay"):  # a model that streams slowly enough to be killed mid-stream
            await asyncio.sleep(plan["word_delay"])
        yield word + " "


shop = Agent(
    FunctionModel(stream_function=play, model_name="shop-script"),
    name="pa-shop",
    instructions="You help customers of the shop.",
)


@shop.tool_plain
def pa_lookup(order_id: str) -> dict:
    """Look an order up (read-only)."""
    if order_id == "ORD-0":
        raise ModelRetry("no such order; ask the customer again")
    return {"order_id": order_id, "amount_cents": 4200}


@shop.tool_plain(metadata=durable(transactional=True))
def pa_note(order_id: str) -> dict:
    """Write a note (rows of this database: inside the step's own commit)."""
    with connection.cursor() as cursor:  # Django refuses this inside a running event loop
        cursor.execute("SELECT 1")
    return {"thread": threading.get_ident(), "in_transaction": connection.in_atomic_block}


@shop.tool(metadata=durable(side_effect=True))
def pa_discount(ctx: RunContext[None], order_id: str, percent: int) -> dict:
    """Give a discount; above 20 percent a person approves it first."""
    if percent > 20 and not ctx.tool_call_approved:
        raise ApprovalRequired(metadata={"reason": "large discount"})
    return {"order_id": order_id, "percent": percent, "approved": ctx.tool_call_approved}


@shop.tool_plain(
    metadata=durable(side_effect=True, idempotency="key", amount_arg="amount_cents", redact=[])
)
def pa_refund(order_id: str, amount_cents: int) -> dict:
    """Refund through the payment gateway with the step's idempotency key."""
    step = current_step()
    try:
        response = gateway_client().post(
            demo_conf.GATEWAY_URL.rstrip("/") + "/refunds",
            json={"order_id": order_id, "amount_cents": amount_cents, "reason": "pa"},
            headers=gateway_headers(step.idempotency_key),
        )
    except httpx.HTTPError as exc:
        raise RetryableToolError(f"gateway unreachable: {exc}") from exc
    if response.status_code >= 500:
        raise RetryableToolError(f"gateway answered {response.status_code}")
    response.raise_for_status()
    body = response.json()
    return {"refund_id": body["id"], "amount_cents": body["amount_cents"]}


@shop.tool(
    requires_approval=True,
    metadata={
        "agentruns": {
            "side_effect": True,
            "editable": {"amount_cents": Edit.at_most_requested(minimum=1)},
            "amount_arg": "amount_cents",
            "approvals_required": lambda args: 2 if args["amount_cents"] > 10_000 else 1,
        }
    },
)
def pa_credit(ctx: RunContext[None], order_id: str, amount_cents: int) -> dict:
    """Credit the customer's account (needs approval; approvers may lower the amount)."""
    return {
        "credited": amount_cents,
        "order_id": order_id,
        "approved": ctx.tool_call_approved,
        "key": current_step().idempotency_key,
    }


register_agent(shop)


def backoffice(
    source: object,
    *,
    name: str = "pa-mcp",
    prefix: str = "bo",
    waive: tuple[str, ...] = (),
    declare: dict | None = None,
    read_timeout: float = 5 * 60,
) -> None:
    """Register an agent with the MCP server at `source` (a URL or a stdio transport) as the
    toolset `prefix`: its tools are bo_get_stock, bo_set_status, bo_send_mail. `waive`: tools
    whose default approval (not read-only) this registration waives; `declare`: more
    declarations by tool name; `read_timeout`: how long a call waits for its answer."""
    from pydantic_ai.mcp import MCPToolset

    agent = Agent(
        FunctionModel(stream_function=play, model_name="mcp-script"),
        name=name,
        instructions="You run the shop's back office.",
        # a generous handshake: a stdio server is a new Python process per call, on a busy machine
        toolsets=[
            MCPToolset(
                source, id="backoffice", init_timeout=60, read_timeout=read_timeout
            ).prefixed(prefix)
        ],
    )
    tools = {tool: {"requires_approval": False} for tool in waive}
    for tool, declared in (declare or {}).items():
        tools[tool] = {**tools.get(tool, {}), **declared}
    register_agent(agent, tools=tools)


def sse_backoffice(url: str) -> None:
    """The same server over SSE (`<base>/sse`) as agent `pa-mcp-sse`, tools `sse_*`, whose
    side-effect tools run without the inbox."""
    backoffice(url, name="pa-mcp-sse", prefix="sse", waive=("sse_set_status", "sse_send_mail"))


def stdio_backoffice(ledger_path: str) -> None:
    """The same server over stdio (a process per call) as agent `pa-mcp-io`, tools `io_*`, whose
    side-effect tools run without the inbox (the crash tests exercise recovery, not approvals)."""
    from tests.pydantic_ai.kit import stdio_transport

    backoffice(
        stdio_transport(Path(ledger_path)),
        name="pa-mcp-io",
        prefix="io",
        waive=("io_set_status", "io_send_mail"),
    )


# worker processes of the crash tests: the server's side-effect tools run without the inbox there
# (they exercise recovery by idempotency class, not approvals)
if os.environ.get("TEST_MCP_URL"):
    backoffice(os.environ["TEST_MCP_URL"], waive=("bo_set_status", "bo_send_mail"))
if os.environ.get("TEST_MCP_SSE_URL"):
    sse_backoffice(os.environ["TEST_MCP_SSE_URL"])
if os.environ.get("TEST_MCP_STDIO_LEDGER"):
    stdio_backoffice(os.environ["TEST_MCP_STDIO_LEDGER"])
