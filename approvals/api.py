"""`GET /api/approvals?status=pending`, `POST /api/approvals/<id>` (DESIGN.md 6)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from agentruns.api.http import BadRequest, api_view, json_body, json_error
from agentruns.runtime.redaction import redact_fields
from agentruns.runtime.timestamps import iso
from approvals.cards import Card, build_cards
from approvals.models import Approval, ApprovalStatus
from approvals.selectors import AGES, approvals_query

from . import services


def approval_payload(approval: Approval, card: Card | None = None) -> dict:
    hidden = approval.hidden_fields
    payload = {
        "id": approval.id,
        "kind": approval.kind,
        "status": approval.status,
        "run_id": str(approval.run_id),
        "step_id": str(approval.step_id),
        "step_index": approval.step.index,
        "agent": approval.agent,
        "tool": approval.tool,
        "requested_args": redact_fields(approval.requested_args, hidden),
        "edited_args": redact_fields(approval.edited_args, hidden),
        "resolution": approval.resolution or None,
        "decided_by": approval.decided_by.get_username() if approval.decided_by else None,
        "decided_at": iso(approval.decided_at),
        "reason": approval.reason,
        "expires_at": iso(approval.expires_at),
        "created_at": iso(approval.created_at),
        "history": [
            {
                **entry,
                "requested_args": redact_fields(entry.get("requested_args"), hidden),
                "edited_args": redact_fields(entry.get("edited_args"), hidden),
            }
            for entry in approval.history
        ],
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


@api_view(("GET",))
def approval_list(request: HttpRequest) -> JsonResponse:
    status = request.GET.get("status", ApprovalStatus.PENDING)
    if status and status not in ApprovalStatus.values:
        raise BadRequest(f"status must be one of {', '.join(ApprovalStatus.values)}")
    try:
        limit = min(max(int(request.GET.get("limit", "100")), 1), 500)
    except ValueError:
        raise BadRequest("limit must be an integer") from None
    age = request.GET.get("age", "")
    if age and age not in AGES:
        raise BadRequest(f"age must be one of {', '.join(AGES)}")
    rows = list(
        approvals_query(
            status=status,
            kind=request.GET.get("kind", ""),
            agent=request.GET.get("agent", ""),
            age=age,
        )[:limit]
    )
    return JsonResponse(
        {"approvals": [approval_payload(card.approval, card) for card in build_cards(rows)]}
    )


@api_view(("POST",))
def approval_decide(request: HttpRequest, approval_id: str) -> JsonResponse:
    if (
        not approval_id.isdigit()
        or len(approval_id) > 18
        or not Approval.objects.filter(id=int(approval_id)).exists()
    ):
        return json_error("no such approval", 404)
    if not request.user.has_perm("approvals.decide_approval"):
        return json_error("permission denied: approvals.decide_approval is required", 403)
    body = json_body(request)
    decision = body.get("decision")
    reason = body.get("reason") or ""
    args = body.get("args")
    if not isinstance(reason, str):
        raise BadRequest("'reason' must be a string")
    if args is not None and not isinstance(args, dict):
        raise BadRequest("'args' must be a JSON object")
    try:
        if decision == "approve":
            approval = services.approve(
                int(approval_id), user=request.user, edited_args=args, reason=reason
            )
        elif decision == "reject":
            approval = services.reject(int(approval_id), user=request.user, reason=reason)
        elif decision in services.RESOLUTIONS:
            approval = services.reconcile(
                int(approval_id),
                user=request.user,
                resolution=decision,
                result=body.get("result"),
                reason=reason,
            )
        else:
            raise BadRequest(
                "'decision' must be 'approve' or 'reject' (or for reconciliation: 'happened', 'retry', 'abort')"
            )
    except services.AlreadyDecided as exc:
        payload = approval_payload(exc.approval)
        return JsonResponse(
            {
                "error": str(exc),
                "decided_by": payload["decided_by"],
                "decided_at": payload["decided_at"],
                "status": payload["status"],
                "approval": payload,
            },
            status=409,
        )
    except services.DecisionError as exc:
        return json_error(str(exc), 422)
    return JsonResponse(approval_payload(approval))
