"""Tools and an agent for the run-pool tests, registered through the public registry (also
imported by real worker processes: AGENTRUNS_AGENT_MODULES=tests.testkit,tests.runtime.poolkit).
"""

from __future__ import annotations

from agentruns.registry import (
    Agent,
    RetryableToolError,
    RetryPolicy,
    ToolContext,
    register_agent,
    tool,
)
from tests.testkit import TOOLS, script_policy

LONG_BACKOFF_SECONDS = 30.0
SHORT_BACKOFF_SECONDS = 3.0


def _fail_first_attempt(ctx: ToolContext) -> dict:
    if ctx.attempt == 1:
        raise RetryableToolError("temporary outage (first attempt)")
    return {"ok": True, "attempt": ctx.attempt, "key": ctx.idempotency_key}


@tool(
    side_effect=True,
    idempotency="key",
    retry=RetryPolicy(max_attempts=2, backoff_seconds=LONG_BACKOFF_SECONDS, jitter=0),
)
def t_flaky_slow(ctx: ToolContext) -> dict:
    """Fails its first attempt; the retry is due LONG_BACKOFF_SECONDS later."""
    return _fail_first_attempt(ctx)


@tool(
    side_effect=True,
    idempotency="key",
    retry=RetryPolicy(max_attempts=2, backoff_seconds=SHORT_BACKOFF_SECONDS, jitter=0),
)
def t_flaky(ctx: ToolContext) -> dict:
    """Fails its first attempt; the retry is due SHORT_BACKOFF_SECONDS later."""
    return _fail_first_attempt(ctx)


register_agent(
    Agent(
        name="pool-script",
        instructions="Follow the script.",
        tools=[*TOOLS, "t_flaky_slow", "t_flaky"],
        scripted_policy=script_policy,
    )
)
