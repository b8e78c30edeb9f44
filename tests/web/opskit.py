"""Extra tools and agents for the run-operations tests, registered like any app's.

Names are prefixed `ops_` so they never collide with tests/testkit.py or other suites.
"""

from __future__ import annotations

from collections import defaultdict

from agentruns.registry import (
    Agent,
    FatalToolError,
    RetryableToolError,
    RetryPolicy,
    ToolContext,
    register_agent,
    tool,
)
from tests import testkit

CALLS: dict[str, list] = defaultdict(list)  # tool -> [(idempotency key, attempt)]
FAILS: dict[str, int] = defaultdict(int)  # tool -> failures still to produce


def reset() -> None:
    CALLS.clear()
    FAILS.clear()


@tool(redact=("api_key", "customer_email"))
def ops_lookup(ctx: ToolContext, customer: str, api_key: str) -> dict:
    """Read-only, with secrets in both its arguments and its result."""
    CALLS["ops_lookup"].append((ctx.idempotency_key, ctx.attempt))
    return {"customer": customer, "customer_email": f"{customer}@example.com", "tier": "gold"}


@tool(
    side_effect=True,
    idempotency="key",
    retry=RetryPolicy(max_attempts=2, backoff_seconds=0.01, backoff_max_seconds=0.05, jitter=0.1),
)
def ops_ship(ctx: ToolContext, parcel: str) -> dict:
    """A side effect that fails transiently FAILS['ops_ship'] times, then fatally if told."""
    CALLS["ops_ship"].append((ctx.idempotency_key, ctx.attempt))
    if FAILS["ops_ship_fatal"] > 0:
        FAILS["ops_ship_fatal"] -= 1
        raise FatalToolError("carrier rejected the label")
    if FAILS["ops_ship"] > 0:
        FAILS["ops_ship"] -= 1
        raise RetryableToolError("carrier timeout")
    return {"shipped": parcel, "tracking": f"TRK-{ctx.idempotency_key[-6:]}"}


OPS_TOOLS = [*testkit.TOOLS, "ops_lookup", "ops_ship"]

register_agent(
    Agent(
        name="ops-script",
        instructions="Follow the script.",
        tools=OPS_TOOLS,
        scripted_policy=testkit.script_policy,
        search_fields=("order_id", "ticket_id"),
    )
)
register_agent(
    Agent(
        name="ops-other",
        instructions="Follow the script.",
        tools=OPS_TOOLS,
        scripted_policy=testkit.script_policy,
        search_fields=("order_id", "ticket_id"),
    )
)
