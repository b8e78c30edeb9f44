"""The demo's refund agent is a Pydantic AI agent, and the offline `scripted` model a Pydantic AI
FunctionModel: what the registry made of them (the semantics the native declaration had) and
what the model streams. The runs themselves are every other test of the demo (tests/crash,
tests/api, tests/stream, tests/e2e)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelRequest, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import ToolDefinition

from agentruns.registry import ScriptedTurn, get_agent, get_tool
from agentruns.runtime.providers.models import model_for, streams
from agentruns.runtime.providers.scripted_model import Playing, playing
from support import agents as support_agents
from tests.model_requests import Params, ask, params, stream

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
        "scope_arg": "order_id",  # every tool of the demo acts on the run's order alone
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
        # one refund per request (ticket) across runs, an order's refunds adding up to at most
        # what was paid (support/ledger.py)
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
            # the customer's request it pays: its operation key is `refund:<ticket_id>`
            "ticket_id": {"type": "string", "pattern": "^T-[A-Za-z0-9-]{1,18}$"},
            "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
            "reason": {"type": "string", "maxLength": 500},
        },
        "required": ["order_id", "ticket_id", "amount_cents", "reason"],
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


def first_turn() -> Params:
    """The refund agent's first request, as its run's loop sends it: the run's input as the user
    prompt, the agent's instructions, its tools."""
    agent = get_agent("refund")
    prompt = '{"message": "refund $10 please", "order_id": "ORD-1001"}'
    tools = [
        ToolDefinition(name=t.name, description=t.description, parameters_json_schema=t.parameters)
        for t in agent.tool_objects()
    ]
    messages = [ModelRequest(parts=[UserPromptPart(prompt)], instructions=agent.instructions)]
    return params(messages, tools)


@contextmanager
def playing_refund(policy=None) -> Iterator[None]:
    """What the scripted model plays during a refund run (engine/loop.py sets it so)."""
    agent = get_agent("refund")
    with playing(Playing(policy=policy or agent.scripted_policy, instructions=agent.instructions)):
        yield


FIRST_TURN_TOKENS = ["Let ", "me ", "look ", "up ", "order ", "ORD-1001 ", "first."]
FIRST_TURN_TEXT = "".join(FIRST_TURN_TOKENS)
FIRST_TURN_CALL = ("call_2_0", "lookup_order", '{"order_id": "ORD-1001"}')
FIRST_TURN_USAGE = (253, 19)


def turn_of(response) -> tuple[str, list[tuple[str, str, str]], tuple[int, int]]:
    """(its text, its calls as (id, name, raw arguments), its usage) of a model response."""
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = [
        (p.tool_call_id, p.tool_name, p.args) for p in response.parts if isinstance(p, ToolCallPart)
    ]
    return text, calls, (response.usage.input_tokens, response.usage.output_tokens)


FIRST_TURN = (FIRST_TURN_TEXT, [FIRST_TURN_CALL], FIRST_TURN_USAGE)


def test_the_scripted_model_is_a_function_model_and_plays_the_refund_policy():
    """Without a delay it is asked whole (the model unit's one delta is its text): a text part
    per token, then the call, with the engine's usage estimate."""
    model = model_for("scripted")
    assert isinstance(model, FunctionModel) and model.stream_function is not None
    assert not streams(model)
    with playing_refund():
        deltas, response = ask(model, first_turn())
    assert deltas == []
    assert [p.content for p in response.parts if isinstance(p, TextPart)] == FIRST_TURN_TOKENS
    assert turn_of(response) == FIRST_TURN


def test_with_a_delay_the_scripted_model_streams_each_token_as_it_comes(settings):
    """Through the model unit's stream: every token is handed on when the function yields it
    (typically the delay after the one before), not when the turn is complete. The median gap:
    a token handed on late on a busy machine makes the next gap shorter; all at the end, every
    gap would be near zero."""
    delay_ms = 40
    settings.SCRIPTED_MODEL_DELAY_MS = delay_ms
    model = model_for("scripted")
    assert streams(model)
    seen: list[tuple[float, str]] = []
    with playing_refund():
        chunks = stream(model, first_turn())
        try:
            while True:
                seen.append((time.monotonic(), next(chunks)))
        except StopIteration as end:
            response = end.value
    assert [delta for _, delta in seen] == FIRST_TURN_TOKENS
    assert turn_of(response) == FIRST_TURN
    gaps = [later - earlier for (earlier, _), (later, _) in zip(seen, seen[1:], strict=False)]
    assert statistics.median(gaps) >= delay_ms / 1000 * 0.9, gaps


def test_a_malformed_tool_call_stays_raw_for_the_engine_to_refuse(settings):
    """A policy's deliberately bad JSON reaches the engine as it was produced (re-serialized it
    would be {"INVALID_JSON": ...}, valid JSON the engine could not tell apart), asked whole or
    streamed."""
    bad = lambda messages: ScriptedTurn(tool_calls=[("x", "{no")])  # noqa: E731
    for delay_ms in (0, 1):
        settings.SCRIPTED_MODEL_DELAY_MS = delay_ms
        with playing_refund(bad):
            _, response = ask(model_for("scripted"), first_turn())
        assert turn_of(response)[1] == [("call_2_0", "x", "{no")], delay_ms
