"""What a refund run's work came to (`Run.outcome`), declared with the agent
(`register_agent(..., outcome=refund_outcome, outcomes=REFUND_OUTCOMES)`; what outcomes are:
agentruns/registry/outcomes/). Read from the run's tool steps as they ended: the refund made
(all of what was paid, or part of it), refused (by a person or by the order's limit), handed
over to a colleague, or the customer answered without any of those.
"""

from __future__ import annotations

from typing import Any

from agentruns.registry.outcomes import HANDED_OVER

REFUNDED = "refunded"
PARTIALLY_REFUNDED = "partially_refunded"
REFUND_REJECTED = "refund_rejected"
ANSWERED = "answered"
# each with its tone for people (the runs list's colours)
REFUND_OUTCOMES = {
    REFUNDED: "positive",
    PARTIALLY_REFUNDED: "positive",
    REFUND_REJECTED: "negative",
    HANDED_OVER: "attention",
    ANSWERED: "neutral",
}


def refund_outcome(run: Any, steps: list[Any]) -> str:
    """The run's outcome from its tool steps (the latest call of each tool counts)."""
    last = {step.tool: step for step in steps}
    refund = last.get("issue_refund")
    if refund is not None and refund.status == "rejected":
        return REFUND_REJECTED
    made = refund.result if refund is not None and refund.status == "succeeded" else None
    if isinstance(made, dict) and isinstance(made.get("amount_cents"), int):
        paid = _paid(last.get("lookup_order"))
        if paid is not None and made["amount_cents"] < paid:
            return PARTIALLY_REFUNDED
        return REFUNDED
    handed = last.get("hand_over")
    if handed is not None and handed.status == "succeeded":
        return HANDED_OVER
    reply = last.get("send_customer_reply")
    if run.status == "succeeded" and reply is not None and reply.status == "succeeded":
        return ANSWERED  # told the customer (an order already refunded by another run, say)
    return ""


def _paid(lookup: Any) -> int | None:
    result = lookup.result if lookup is not None else None
    amount = result.get("amount_cents") if isinstance(result, dict) else None
    return amount if isinstance(amount, int) else None
