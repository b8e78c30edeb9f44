"""What a refund run's work came to (`Run.outcome`), declared with the agent
(`register_agent(..., outcome=refund_outcome, outcomes=REFUND_OUTCOMES)`; what outcomes are:
agentruns/registry/outcomes/). Read from the run's tool steps as they ended: the refund made
(all of what was paid, or part of it), rejected by a person, not made (this request was paid
before, or the order's refunds already reach what was paid), handed over to a colleague, or
the customer answered without any of those.
"""

from __future__ import annotations

from typing import Any

from agentruns.registry.outcomes import HANDED_OVER

REFUNDED = "refunded"
PARTIALLY_REFUNDED = "partially_refunded"
REFUND_REJECTED = "refund_rejected"
# this request was paid before (told the customer when and how much), or the call was not made
# (the order's refunds already reach what was paid, or it was refused): nothing was paid
ALREADY_REFUNDED = "already_refunded"
NOT_REFUNDED = "not_refunded"
ANSWERED = "answered"
# each with its tone for people (the runs list's colours)
REFUND_OUTCOMES = {
    REFUNDED: "positive",
    PARTIALLY_REFUNDED: "positive",
    REFUND_REJECTED: "negative",
    ALREADY_REFUNDED: "neutral",
    NOT_REFUNDED: "negative",
    HANDED_OVER: "attention",
    ANSWERED: "neutral",
}


def refund_outcome(run: Any, steps: list[Any]) -> str:
    """The run's outcome from its tool steps (the latest call of each tool counts)."""
    last = {step.tool: step for step in steps}
    refund = last.get("issue_refund")
    if refund is not None and refund.status == "rejected":
        # the runtime's refusals (the order's limit, a key it could not compute) say "refused:"
        return NOT_REFUNDED if str(refund.error).startswith("refused:") else REFUND_REJECTED
    made = refund.result if refund is not None and refund.status == "succeeded" else None
    if isinstance(made, dict) and made.get("already_done"):
        return ALREADY_REFUNDED  # answered with this request's earlier refund: nothing paid
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
        return _told(last.get("lookup_order"), refund)
    return ""


def _told(lookup: Any, refund: Any) -> str:
    """A run that told the customer without refunding: the request was paid before (the lookup
    said so), the order had nothing left, or it was a question answered."""
    result = lookup.result if lookup is not None else None
    if refund is None and isinstance(result, dict):
        if isinstance(result.get("request_refunded"), dict):
            return ALREADY_REFUNDED
        if result.get("remaining_cents") == 0 and result.get("refunded_cents"):
            return NOT_REFUNDED
    return ANSWERED


def _paid(lookup: Any) -> int | None:
    result = lookup.result if lookup is not None else None
    amount = result.get("amount_cents") if isinstance(result, dict) else None
    return amount if isinstance(amount, int) else None
