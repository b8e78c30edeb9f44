"""Tools and an agent for the run-pool tests, registered through the public registry (also
imported by real worker processes: AGENTRUNS_AGENT_MODULES=tests.testkit,tests.runtime.poolkit).
"""

from __future__ import annotations

import time

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
SLOW_CALL_SECONDS = 60.0


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


@tool(side_effect=True, idempotency="key")
def t_slow(ctx: ToolContext) -> dict:
    """A call far longer than a drain's grace period on its first attempt; instant afterwards."""
    if ctx.attempt == 1:
        time.sleep(SLOW_CALL_SECONDS)
    return {"attempt": ctx.attempt, "key": ctx.idempotency_key}


register_agent(
    Agent(
        name="pool-script",
        instructions="Follow the script.",
        tools=[*TOOLS, "t_flaky_slow", "t_flaky", "t_slow"],
        scripted_policy=script_policy,
    )
)
