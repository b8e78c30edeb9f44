"""`GET /api/approvals?status=pending`, `POST /api/approvals/<id>` (DESIGN.md 6)."""

from __future__ import annotations

from django.http import HttpRequest

from agentruns.api.endpoint import INT_ID, endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import COUNT, TEXT_OR_NULL, TIME, TIME_OR_NULL, obj
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals import services
from approvals.domain import decisions
from approvals.domain.context import context_for
from approvals.domain.history import not_made
from approvals.domain.selectors import AGES, approvals_query
from approvals.errors import (
    AlreadyDecided,
    AlreadyGiven,
    DecisionError,
    NotRunnable,
    StaleProposal,
    error_details,
    status_of,
)
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from approvals.web.cards import Card, build_cards, cannot_run_now, ticket_id_of

ARGS_OR_NULL = {"type": ["object", "null"]}
APPROVAL = obj(
    {
        "id": COUNT,
        "kind": {"type": "string", "enum": ApprovalKind.values},
        "status": {"type": "string", "enum": ApprovalStatus.values},
        "run_id": {"type": "string", "format": "uuid"},
        "step_id": {"type": "string", "format": "uuid"},
        "step_index": COUNT,
        "agent": {"type": "string"},
        "tool": {"type": "string"},
        "args": {"type": "object"},
        "requested_args": {"type": "object"},
        "edited_args": ARGS_OR_NULL,
        "resolution": TEXT_OR_NULL,
        "decided_by": TEXT_OR_NULL,
        "decided_at": TIME_OR_NULL,
        # what the agent was told (a rejection's reason, which it may pass on to the customer)
        "reason": {"type": "string"},
        # the decider's note for staff only (never the agent's or the customer's)
        "internal_note": {"type": "string"},
        # a question (kind `question`): what the agent asked, the choices if any, the answer
        "question": TEXT_OR_NULL,
        "choices": {"type": ["array", "null"], "items": {"type": "string"}},
        "answer": TEXT_OR_NULL,
        "expires_at": TIME_OR_NULL,
        "created_at": TIME,
        # its run's priority: lists show the highest first, then the newest
        "priority": {"type": "integer"},
        # claims and due times
        "claimed_by": TEXT_OR_NULL,
        "claimed_at": TIME_OR_NULL,
        "claim_expires_at": TIME_OR_NULL,
        "due_at": TIME_OR_NULL,
        "escalated_at": TIME_OR_NULL,
        "overdue": {"type": "boolean"},
        "history": {"type": "array", "items": {"type": "object"}},
        # the two-person rule
        "approvals_required": COUNT,
        "approvals_given": COUNT,
        "round": COUNT,
        # the proposal's version: send it back with a decision (a stale one is a 409)
        "version": COUNT,
        # why the deployed code cannot run this call ("" when it can; approving is then a 409)
        "cannot_run": {"type": "string"},
        # across runs, while pending: what the tool declares (the demo's refund: the order, its
        # refunds with totals) with `operation` (the call's key: its executions, what the call
        # meets) and `pending` (other pending items of the key); null when decided
        "context": {"type": ["object", "null"]},
        # the customer's request the item is about, when its run names one (a hand-over is
        # finished on its ticket)
        "ticket_id": TEXT_OR_NULL,
        # an approved call that was not made (already done, refused by its limit when it was
        # about to run, failed): why, in words; null when it was made or has not run yet
        "not_made": TEXT_OR_NULL,
        "starter": TEXT_OR_NULL,
        "decisions": {
            "type": "array",
            "items": obj(
                {
                    "by": {"type": "string"},
                    "decision": {"type": "string", "enum": ["approve", "reject", "close"]},
                    "at": TIME,
                    "round": COUNT,
                    "counted": {"type": "boolean"},
                    "edited": {"type": "boolean"},
                    "args": ARGS_OR_NULL,
                    "reason": {"type": "string"},
                    "internal_note": {"type": "string"},
                }
            ),
        },
        "summary": obj(
            {
                "customer": TEXT_OR_NULL,
                "order_id": TEXT_OR_NULL,
                "amount_cents": {"type": ["integer", "null"]},
                "currency": TEXT_OR_NULL,
                "reason": TEXT_OR_NULL,
                "request": TEXT_OR_NULL,
                "recent_text": {"type": "array", "items": {"type": "string"}},
            }
        ),
    },
    optional=("summary",),
)


def claim_payload(approval: Approval) -> dict:
    """Who is on the item right now (nobody once the claim lapsed or the item is decided)."""
    holder = approval.claimant()
    return {
        "claimed_by": actor_name(holder),
        "claimed_at": iso(approval.claimed_at) if holder else None,
        "claim_expires_at": iso(approval.claim_expires_at) if holder else None,
    }


def approval_payload(approval: Approval, card: Card | None = None) -> dict:
    payload = {
        "id": approval.id,
        "kind": approval.kind,
        "status": approval.status,
        "run_id": str(approval.run_id),
        "step_id": str(approval.step_id),
        "step_index": approval.step.index,
        "agent": approval.agent,
        "tool": approval.tool,
        "args": approval.redacted(approval.effective_args),
        "requested_args": approval.visible_args(),
        "edited_args": approval.redacted(approval.edited_args),
        "resolution": approval.resolution or None,
        "decided_by": approval.decided_by_name,
        "decided_at": iso(approval.decided_at),
        "reason": approval.reason,
        "internal_note": approval.internal_note,
        "question": approval.question or None,
        "choices": approval.choices,
        "answer": approval.answer or None,
        "expires_at": iso(approval.expires_at),
        "created_at": iso(approval.created_at),
        "priority": approval.priority,
        **claim_payload(approval),
        "due_at": iso(approval.due_at),
        "escalated_at": iso(approval.escalated_at),
        "overdue": approval.is_overdue,
        "history": [
            {
                **entry,
                "requested_args": approval.redacted(entry.get("requested_args")),
                "edited_args": approval.redacted(entry.get("edited_args")),
            }
            for entry in approval.history
        ],
        # the two-person rule: still `pending` until approvals_given reaches approvals_required
        **decisions.payload(approval),
        "cannot_run": card.cannot_run if card is not None else cannot_run_now(approval),
        "context": card.context if card is not None else context_for(approval),
        "ticket_id": card.ticket_id if card is not None else ticket_id_of(approval),
        "not_made": (card.not_made if card is not None else not_made(approval)) or None,
    }
    if card is not None:
        # what the inbox card shows, for scripts that triage without opening the run
        payload["summary"] = {
            "customer": card.customer,
            "order_id": card.order_id,
            "amount_cents": card.amount_cents,
            "currency": card.currency or None,
            "reason": card.reason_given or None,
            "request": card.request_text or None,
            "recent_text": card.recent_text,
        }
    return payload


@endpoint(
    "GET",
    "/approvals",
    summary="Inbox items, newest first",
    permission="approvals.view_approval",
    query={
        "status": {"type": "string", "enum": ["", *ApprovalStatus.values]},
        "kind": {"type": "string", "enum": ApprovalKind.values},
        "agent": {"type": "string", "maxLength": Approval._meta.get_field("agent").max_length},
        "age": {"type": "string", "enum": list(AGES)},
        "limit": {"type": "integer", "minimum": 1, "maximum": 500},
    },
    tags=("approvals",),
    returns=obj({"approvals": {"type": "array", "items": APPROVAL}}),
    provides={"approval_id": "/approvals/0/id"},
)
def approval_list(
    request: HttpRequest,
    status: str = ApprovalStatus.PENDING,
    kind: str = "",
    agent: str = "",
    age: str = "",
    limit: int = 100,
) -> dict:
    rows = list(approvals_query(status=status, kind=kind, agent=agent, age=age)[:limit])
    return {"approvals": [approval_payload(card.approval, card) for card in build_cards(rows)]}


def already_decided(exc: AlreadyDecided) -> BadRequest:
    """The 409 of a late decision (or claim): who decided, when, and the item as it is."""
    payload = approval_payload(exc.approval)
    return BadRequest(
        str(exc),
        409,
        decided_by=payload["decided_by"],
        decided_at=payload["decided_at"],
        status=payload["status"],
        approval=payload,
    )


@endpoint(
    "POST",
    "/approvals/{approval_id}",
    summary=(
        "Decide: approve (optionally with edited args) or reject; reconcile an unknown outcome; "
        "close a hand-over; answer a question"
    ),
    permission="approvals.decide_approval",
    path_params={"approval_id": INT_ID},
    body={
        "decision": {"type": "string", "enum": list(services.DECISIONS)},
        # what the agent is told (and may pass on to the customer)
        "reason": {"type": "string", "maxLength": 2000},
        # for staff only: kept in the audit trail, never shown to the agent or the customer;
        # rejecting or closing needs a reason, an internal note, or both
        "internal_note": {"type": "string", "maxLength": 2000},
        "args": {"type": "object"},
        "result": {},
        # the `version` of the proposal decided on; without it only an item nobody edited
        "version": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        # `answer`: the answer to a question (its `choices` are offered first; free text too)
        "answer": {"type": "string", "maxLength": 4000},
    },
    required=("decision",),
    responses={
        200: "the approval (still pending while more approvals are required)",
        400: "an edit outside the tool's edit policy (names the field and the rule); a "
        "rejection or a close without a reason or an internal note (`fields`); an empty answer "
        "(free text is an answer even when the question offers choices)",
        403: "no right to decide this (permission, the run's starter, above your limit or your "
        "total per day: `figures`)",
        409: "already decided, already approved by you, a stale `version` (with the current "
        "proposal), or a call the deployed code cannot run",
        422: "not acceptable (e.g. a reconciliation answer for an approval, or over the tool's "
        "limit: code `over_limit` with `figures`)",
    },
    tags=("approvals",),
    returns=APPROVAL,
    example={"decision": "approve", "reason": "checked the order"},
)
def approval_decide(request: HttpRequest, approval_id: str, body: dict) -> dict | tuple[dict, int]:
    if not Approval.objects.filter(id=int(approval_id)).exists():
        raise BadRequest("no such approval", 404)
    try:
        approval = services.decide(
            int(approval_id),
            body["decision"],
            request.user,
            edited_args=body.get("args"),
            reason=body.get("reason", ""),
            version=body.get("version"),
            result=body.get("result"),
            door=services.Door.API,
            internal_note=body.get("internal_note", ""),
            answer=body.get("answer", ""),
        )
    except AlreadyDecided as exc:
        raise already_decided(exc) from None
    except DecisionError as exc:
        extra = error_details(exc)
        if isinstance(exc, AlreadyGiven | StaleProposal | NotRunnable):
            extra["approval"] = approval_payload(_reloaded(approval_id))  # the current proposal
        raise BadRequest(str(exc), status_of(exc), **extra) from None
    return approval_payload(_reloaded(approval.id))


def _reloaded(approval_id: int | str) -> Approval:
    return approvals_query(status="").get(id=int(approval_id))
