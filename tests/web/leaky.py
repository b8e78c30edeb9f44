"""A tool that leaks its secret argument everywhere it can: into its error, its traceback and
the log. Loaded by the worker with AGENTRUNS_AGENT_MODULES (tests/web/test_redaction.py)."""

from __future__ import annotations

import logging

from agentruns.registry import (
    Agent,
    FatalToolError,
    ScriptedTurn,
    ToolContext,
    register_agent,
    tool,
)

# a credential by pattern ("sk-...") and a value only the tool's redact list marks as secret
PATTERN_SECRET = "sk-planted-9f8e7d6c5b4a3210"
VALUE_SECRET = "hunter2-planted-value"

log = logging.getLogger("tests.leaky")


def _vendor_call(api_key: str, pin: str) -> None:
    raise RuntimeError(f"vendor refused api_key={api_key} pin={pin}")


@tool(side_effect=True, idempotency="key", redact=("api_key", "pin"))
def t_leaky_vendor(ctx: ToolContext, api_key: str, pin: str, note: str) -> dict:
    """Calls a vendor with a secret key; the vendor refuses and echoes it."""
    try:
        _vendor_call(api_key, pin)
    except RuntimeError as exc:
        log.exception("vendor call failed with Bearer %s", api_key)
        raise FatalToolError(f"vendor said: {exc}") from exc
    return {}


def leaky_policy(messages: list[dict]) -> ScriptedTurn:
    if any(m["role"] == "tool" for m in messages):
        return ScriptedTurn(text="The vendor refused; giving up.")
    args = {"api_key": PATTERN_SECRET, "pin": VALUE_SECRET, "note": "pay the vendor"}
    return ScriptedTurn(text="Calling the vendor.", tool_calls=[("t_leaky_vendor", args)])


register_agent(
    Agent(
        name="leaky",
        instructions="Call the vendor.",
        tools=["t_leaky_vendor"],
        scripted_policy=leaky_policy,
    )
)
