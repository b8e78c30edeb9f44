"""The demo's refund agent is a Pydantic AI agent, and the offline `scripted` model a Pydantic AI
FunctionModel: what the registry made of them (the semantics the native declaration had) and
what the model streams. The runs themselves are every other test of the demo (tests/crash,
tests/api, tests/stream, tests/e2e)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.function import FunctionModel

from agentruns.registry import ScriptedTurn, get_agent, get_tool
from agentruns.runtime.providers import TextDelta, ToolCall, Usage, get_provider
from agentruns.runtime.providers.base import ModelRequest
from support import agents as support_agents

TOOLS = ["lookup_order", "issue_refund", "add_ticket_note", "hand_over", "send_customer_reply"]
DEFAULT_RETRY = {
    "max_attempts": 3,
    "backoff_seconds": 0.5,
    "backoff_max_seconds": 30.0,
    "jitter": 0.25,
    "retry_on": ["RetryableToolError"],
}


def _policy(**changes: object) -> dict:
    base = {
        "side_effect": True,
        "idempotency": "key",
        "redact": [],
        "retry": DEFAULT_RETRY,
        "approval": False,
        "transactional": False,
        "escalate_after": None,
        "approvals": 1,
        "amount_arg": None,
        "editable": {},
        "operation_key": False,
        "limit": False,
    }
    return {**base, **changes}


def test_the_refund_agent_is_a_pydantic_ai_agent_with_the_declared_semantics():
    assert isinstance(support_agents.refund_agent, PydanticAgent)
    agent = get_agent("refund")
    assert list(agent.tools) == TOOLS
    assert agent.model is None  # AGENTRUNS_MODEL decides: scripted offline
    assert agent.search_fields == ("order_id", "ticket_id")
    assert agent.replies == {"send_customer_reply": "message"}  # the run page shows the reply
    assert agent.instructions.startswith("You are a support agent for an online shop.")
    assert get_tool("lookup_order").policy() == _policy(
        side_effect=False, redact=["customer_email"]
    )
    assert get_tool("issue_refund").policy() == _policy(
        retry={**DEFAULT_RETRY, "backoff_max_seconds": 5},
        approval="predicate",
        approvals="predicate",
        amount_arg="amount_cents",
        editable={
            "amount_cents": {"rule": "at_most_requested", "minimum": 1},
            "reason": {"rule": "free"},
        },
        # one refund per order across runs, adding up to what was paid (support/ledger.py)
        operation_key=True,
        limit=True,
    )
    assert get_tool("add_ticket_note").policy() == _policy()
    # a trainee's run hands its request over to a person (an inbox item when the run ends)
    assert get_tool("hand_over").policy() == _policy(side_effect=False)
    assert get_tool("hand_over").handover and not get_tool("issue_refund").handover
    assert get_tool("send_customer_reply").policy() == _policy(idempotency="none")
    assert get_tool("issue_refund").parameters == {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]+$"},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
            "reason": {"type": "string", "maxLength": 500},
        },
        "required": ["order_id", "amount_cents", "reason"],
        "additionalProperties": False,
    }


def test_refund_approval_rules(settings):
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 5000
    settings.REFUND_TWO_PERSON_CENTS = 50_000
    refund = get_tool("issue_refund")
    assert not refund.needs_approval({"amount_cents": 5000})
    assert refund.needs_approval({"amount_cents": 5001})
    assert refund.approvals_for({"amount_cents": 50_000}) == 1
    assert refund.approvals_for({"amount_cents": 50_001}) == 2


def _first_turn() -> ModelRequest:
    agent = get_agent("refund")
    messages = [
        {"role": "system", "content": agent.instructions},
        {"role": "user", "content": '{"message": "refund $10 please", "order_id": "ORD-1001"}'},
    ]
    tools = [t.schema() for t in agent.tool_objects()]
    return ModelRequest(model="scripted", messages=messages, tools=tools, agent=agent)


EXPECTED_FIRST_TURN = [
    *(TextDelta(t) for t in ["Let ", "me ", "look ", "up ", "order ", "ORD-1001 ", "first."]),
    ToolCall(id="call_2_0", name="lookup_order", arguments='{"order_id": "ORD-1001"}'),
    Usage(prompt_tokens=138, completion_tokens=19),
]


def test_the_scripted_model_is_a_function_model_and_plays_the_refund_policy():
    provider = get_provider("scripted", get_agent("refund"))
    assert isinstance(provider.model, FunctionModel)
    assert provider.model.stream_function is not None
    assert list(provider.stream(_first_turn())) == EXPECTED_FIRST_TURN


def test_with_a_delay_the_scripted_model_streams_each_token_as_it_comes(settings):
    """Through Pydantic AI's sync stream: every token is handed on when the function yields it
    (at least the delay after the one before), not when the turn is complete."""
    delay_ms = 40
    settings.SCRIPTED_MODEL_DELAY_MS = delay_ms
    provider = get_provider("scripted", get_agent("refund"))
    assert provider.waits and not provider.instant
    seen: list[tuple[float, object]] = []
    for item in provider.stream(_first_turn()):
        seen.append((time.monotonic(), item))
    assert [item for _, item in seen] == EXPECTED_FIRST_TURN
    texts = [at for at, item in seen if isinstance(item, TextDelta)]
    gaps = [later - earlier for earlier, later in zip(texts, texts[1:], strict=False)]
    assert min(gaps) >= delay_ms / 1000 * 0.9, gaps


def test_a_malformed_tool_call_stays_raw_for_the_engine_to_refuse():
    """A policy's deliberately bad JSON reaches the engine as it was produced (Pydantic AI would
    re-serialize it as {"INVALID_JSON": ...}, valid JSON the engine could not tell apart)."""
    request = _first_turn()
    request.agent = SimpleNamespace(
        scripted_policy=lambda messages: ScriptedTurn(tool_calls=[("x", "{no")])
    )
    provider = get_provider("scripted", request.agent)
    calls = [c for c in provider.stream(request) if isinstance(c, ToolCall)]
    assert calls == [ToolCall(id="call_2_0", name="x", arguments="{no")]
