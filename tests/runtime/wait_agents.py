"""A Pydantic AI agent that waits (AGENTRUNS_AGENT_MODULES=tests.runtime.wait_agents in worker
processes): `wait_tools()` for the model, and tools that wait for an outside event by a token
of the engineer's choosing. Its model plays the run's message as tests/pydantic_ai/agents.py's
does ({"calls": [[tool, args], ...], "say": "..."})."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel

from agentruns.registry import (
    EventWaitFailed,
    TokenHeld,
    durable,
    register_agent,
    sleep_for,
    sleep_until,
    wait_for_event,
    wait_tools,
)
from tests.pydantic_ai.agents import play

# how often each tool call began (the call runs again from its start once the run resumes)
CALLS: Counter = Counter()

waiter = Agent(
    FunctionModel(stream_function=play, model_name="waits-script"),
    name="pa-waits",
    instructions="You follow parcels.",
    toolsets=[wait_tools()],
)


@waiter.tool_plain(metadata=durable(side_effect=True, idempotency="key"))
def await_delivery(order_id: str, timeout: float | None = None) -> dict:
    """Wait for the carrier's delivery event of an order."""
    CALLS[order_id] += 1
    try:
        event = wait_for_event(f"carrier:{order_id}", timeout=timeout)
    except TokenHeld as held:
        return {"held_by": held.holder}
    except EventWaitFailed as failed:
        return {"failed": type(failed).__name__, "why": str(failed)}
    return {"event": event}


@waiter.tool_plain
def nap(seconds: float) -> dict:
    """Tool code sleeping durably."""
    return sleep_for(seconds)


@waiter.tool_plain(metadata=durable(side_effect=True, idempotency="key"))
async def await_pickup(order_id: str) -> dict:
    """An async tool waiting for the courier's pickup event."""
    return {"event": wait_for_event(f"pickup:{order_id}")}


@waiter.tool_plain(metadata=durable(side_effect=True, idempotency="key"))
def settle_then_await(order_id: str) -> dict:
    """A sleep already due, then the carrier's event (the call runs again once it comes)."""
    slept = sleep_until(datetime(2020, 1, 1, tzinfo=UTC))
    return {"slept": slept, "event": wait_for_event(f"carrier:{order_id}")}


@waiter.tool_plain
def nap_then_sleep(seconds: float) -> dict:
    """A sleep of nothing, then a long one."""
    return {"first": sleep_for(0), "second": sleep_for(seconds)}


register_agent(waiter)
