"""A Pydantic AI agent that asks a colleague (`ask_human` from `wait_tools()`), registered like a
user's (AGENTRUNS_AGENT_MODULES=tests.approvals.question_agent in worker processes).

Its model is the tests' streaming `FunctionModel` (tests/pydantic_ai/agents.py `play`): the run's
message is a plan {"calls": [["ask_human", {...}]], "say": "..."}; the turn after the last call
says `say` followed by what the tools answered ("ask_human=<the answer>"), so the run's output
is what the model read as the call's result. `SEEN` keeps each tool result the model was sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic_ai import Agent, CallDeferred
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.registry import register_agent, wait_tools
from tests.pydantic_ai.agents import play

SEEN: list[tuple[str, object]] = []


async def asking(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | dict]:
    last = messages[-1]
    if isinstance(last, ModelRequest):
        SEEN.extend((p.tool_name, p.content) for p in last.parts if isinstance(p, ToolReturnPart))
    async for chunk in play(messages, info):
        yield chunk


asker = Agent(
    FunctionModel(stream_function=asking, model_name="asker-script"),
    name="pa-asker",
    instructions="You help customers; ask a colleague when a policy question comes up.",
    toolsets=[wait_tools()],
)
register_agent(asker)


policy = Agent(
    FunctionModel(stream_function=play, model_name="policy-script"),
    name="pa-policy",
    instructions="You check refund policies.",
)


@policy.tool_plain
def policy_check(order_id: str) -> str:
    """Ask a person whether the refund policy applies (any tool may defer as a question)."""
    raise CallDeferred(
        {"question": f"Refund {order_id}?", "choices": ["yes", "no"]}, kind="question"
    )


register_agent(policy)
