"""A Pydantic AI agent of the conversation tests (issue 33) that answers from the whole history.

Its `FunctionModel` reads every user prompt of the history it is given: a last prompt with
"refund <cents>" calls `talk_refund` (a person approves above 100 cents), one with "lookup" calls
`talk_lookup` ("lookup then refund <cents>": the refund after the lookup's answer); after a tool answered it says what the tools said; otherwise it answers
"heard: <every prompt so far, oldest first, joined by ' | '>", so a test reads off the answer
exactly which history the run was given.
"""

from __future__ import annotations

import re

from pydantic_ai import Agent, ApprovalRequired, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.registry import durable, register_agent, wait_tools

CALLS: list[tuple[str, dict]] = []  # the tool calls executed in this process
GIVEN: list[list[ModelMessage]] = []  # the messages each model request was given


def prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    GIVEN.append(list(messages))
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    heard = prompts(messages)
    latest = heard[-1] if heard else ""
    turn = sum(isinstance(m, ModelResponse) for m in messages)

    def tool(does: str) -> str:  # this agent's name of the tool (talk_refund, order_refund)
        return next(t.name for t in info.function_tools if t.name.endswith(f"_{does}"))

    then_refund = re.search(r"then refund (\d+)", latest)
    if returns and then_refund and all(p.tool_name == tool("lookup") for p in returns):
        args = {"amount_cents": int(then_refund.group(1))}
        return ModelResponse(parts=[ToolCallPart(tool("refund"), args, tool_call_id=f"r{turn}")])
    if returns:
        said = " | ".join(f"{p.tool_name}={p.content}" for p in returns)
        return ModelResponse(parts=[TextPart(f"done: {said}")])
    refund = re.search(r"refund (\d+)", latest)
    if refund and "lookup" not in latest:
        args = {"amount_cents": int(refund.group(1))}
        return ModelResponse(parts=[ToolCallPart(tool("refund"), args, tool_call_id=f"r{turn}")])
    if "lookup" in latest:
        return ModelResponse(parts=[ToolCallPart(tool("lookup"), {}, tool_call_id=f"l{turn}")])
    return ModelResponse(parts=[TextPart("heard: " + " | ".join(heard))])


talk = Agent(FunctionModel(answer, model_name="talk-script"), name="pa-talk")


@talk.tool_plain
def talk_lookup() -> dict:
    """Look the order up (read-only)."""
    CALLS.append(("talk_lookup", {}))
    return {"order": "ORD-1", "status": "delivered"}


@talk.tool(metadata=durable(side_effect=True, idempotency="key"))
def talk_refund(ctx: RunContext[None], amount_cents: int) -> dict:
    """Refund; a person approves above 100 cents."""
    if amount_cents > 100 and not ctx.tool_call_approved:
        raise ApprovalRequired()
    CALLS.append(("talk_refund", {"amount_cents": amount_cents}))
    return {"refunded": amount_cents}


register_agent(talk)

# the same conversation about an order, keyed by it (issue 30: one run per order at a time)
talk_order = Agent(
    FunctionModel(answer, model_name="talk-script"),
    name="pa-talk-order",
    tools=[
        Tool(talk_lookup, name="order_lookup"),
        Tool(
            talk_refund,
            name="order_refund",
            metadata=durable(side_effect=True, idempotency="key"),
        ),
    ],
)
register_agent(talk_order, concurrency_key=lambda run_input: run_input["order_id"])


def ask_or_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A last prompt beginning "ask" asks the customer which order; a reply is said back."""
    GIVEN.append(list(messages))
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returns:
        reply = returns[0].content
        if isinstance(reply, dict):
            return ModelResponse(parts=[TextPart(f"got: {reply['reply']} from {reply['from']}")])
        return ModelResponse(parts=[TextPart(f"told: {reply}")])
    heard = prompts(messages)
    if heard and heard[-1].startswith("ask"):
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        question = {"question": "Which order do you mean?"}
        return ModelResponse(
            parts=[ToolCallPart("ask_customer", question, tool_call_id=f"a{turn}")]
        )
    return ModelResponse(parts=[TextPart("heard: " + " | ".join(heard))])


# asks the customer within its turn (issue 33: a run waiting for the thread's next message)
asker = Agent(
    FunctionModel(ask_or_answer, model_name="ask-customer-script"),
    name="pa-ask-customer",
    toolsets=[wait_tools()],
)
register_agent(asker)
