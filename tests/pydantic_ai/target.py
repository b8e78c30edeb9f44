"""The agent of issue 32's first target, registered like a user's (worker processes:
AGENTRUNS_AGENT_MODULES=tests.pydantic_ai.target): a structured output type, an instructions
function, an output validator that sends the model back once, and a model that cannot stream
(a `FunctionModel` without a stream function). Its refund tool needs a person's approval and
refunds through the fake payment gateway with the step's idempotency key.

The model plays the run's message {"order_id": ..., "amount_cents": ...}: it asks for the
refund, then answers with the refund as the output, first with a refund id of its own making
(the validator sends it back: it must be the gateway's), then with the gateway's.
"""

from __future__ import annotations

import json

import httpx
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentruns.registry import RetryableToolError, current_step, durable, register_agent
from support.agents import gateway_client, gateway_headers
from support.conf import demo_conf
from tests.pydantic_ai.kit import planned


class RefundMade(BaseModel):
    order_id: str
    amount_cents: int
    refund_id: str


def _parts(messages: list[ModelMessage], kind: type) -> list:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, kind)
    ]


def refunds_whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One whole response per request (no stream function: this model cannot stream)."""
    asked = planned(messages)
    if f"order {asked.get('order_id')}" not in (info.instructions or ""):
        return ModelResponse(parts=[TextPart("I was not told which order to refund.")])
    made = [p for p in _parts(messages, ToolReturnPart) if p.tool_name == "tgt_refund"]
    if not made:
        args = {"order_id": asked["order_id"], "amount_cents": asked["amount_cents"]}
        return ModelResponse(
            parts=[ToolCallPart("tgt_refund", json.dumps(args), tool_call_id="r0")]
        )
    result = made[-1].content
    sent_back = [
        p
        for p in _parts(messages, ToolReturnPart)
        if p.tool_call_id == "out" and p.outcome == "retried"
    ]
    output = {
        "order_id": asked["order_id"],
        "amount_cents": result["amount_cents"],
        # the first answer makes an id up; the validator sends it back for the gateway's
        "refund_id": result["refund_id"] if sent_back else "REF-MADE-UP",
    }
    tool = info.output_tools[0].name
    return ModelResponse(parts=[ToolCallPart(tool, json.dumps(output), tool_call_id="out")])


target = Agent(
    FunctionModel(function=refunds_whole, model_name="target-script"),
    name="pa-target",
    output_type=RefundMade,
)


@target.instructions
def which_order(ctx: RunContext[None]) -> str:
    return f"Refund order {json.loads(ctx.prompt)['order_id']} once a person approved it."


@target.output_validator
def from_the_gateway(ctx: RunContext[None], output: RefundMade) -> RefundMade:
    if not output.refund_id.startswith("rf_"):
        raise ModelRetry("refund_id must be the gateway's refund id (rf_...)")
    return output


@target.tool(
    requires_approval=True,
    metadata=durable(side_effect=True, idempotency="key", amount_arg="amount_cents"),
)
def tgt_refund(ctx: RunContext[None], order_id: str, amount_cents: int) -> dict:
    """Refund through the payment gateway with the step's idempotency key (approved first)."""
    try:
        response = gateway_client().post(
            demo_conf.GATEWAY_URL.rstrip("/") + "/refunds",
            json={"order_id": order_id, "amount_cents": amount_cents, "reason": "target"},
            headers=gateway_headers(current_step().idempotency_key),
        )
    except httpx.HTTPError as exc:
        raise RetryableToolError(f"gateway unreachable: {exc}") from exc
    if response.status_code >= 500:
        raise RetryableToolError(f"gateway answered {response.status_code}")
    response.raise_for_status()
    body = response.json()
    return {"refund_id": body["id"], "amount_cents": body["amount_cents"]}


register_agent(target)
