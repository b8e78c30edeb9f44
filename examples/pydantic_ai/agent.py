from pathlib import Path

from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import MCPToolset

from agentruns.registry import current_step, durable, register_agent

agent = Agent(  # no model: AGENTRUNS_MODEL decides (scripted, openai:..., anthropic:...)
    name="shop",
    instructions="You help the shop's customers. Be brief.",
    # an MCP server (stdio; a URL works too): read-only tools run freely, the others need approval
    toolsets=[MCPToolset(Path("examples/pydantic_ai/backoffice.py")).prefixed("bo")],
)


@agent.tool_plain(metadata=durable(side_effect=True, idempotency="key"))
def refund(order_id: str, amount_cents: int) -> dict:
    """Refund an order. The payment service deduplicates on the idempotency key."""
    key = current_step().idempotency_key  # the same on every attempt of this call
    return {"order_id": order_id, "refunded_cents": amount_cents, "idempotency_key": key}


@agent.tool(requires_approval=True, metadata=durable(side_effect=True))
def close_account(ctx: RunContext[None], customer_id: str) -> str:
    """Close a customer's account (a person approves it in the inbox first)."""
    return f"account {customer_id} closed"


register_agent(agent)
