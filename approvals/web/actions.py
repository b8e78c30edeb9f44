"""The inbox's other actions: claim and release an item, decide many at once, one item's page,
allow one more execution of an item's operation key.

Same rules as the JSON API (`approvals/api/actions.py`): `claims.py` and the decision
service (`services.decide_many`) decide. Deciding in bulk here skips items someone else holds unless the person
confirmed (the inbox asks first), like a single decision does.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from agentruns import services as run_services
from agentruns.runtime.values.ids import BadId, parse_versioned_id
from agentruns.runtime.values.timestamps import moment_text
from agentruns.services import ActionRefused
from agentruns.services.operations import ALLOW_PERMISSION
from agentruns.web.layout.navigation import record_url
from approvals import services
from approvals.domain import claims, policy
from approvals.domain.selectors import approvals_query
from approvals.errors import AlreadyDecided, ClaimedByOther, DecisionError, NoteRequired
from approvals.models import Approval, ApprovalKind
from approvals.web.cards import card_for, ticket_id_of
from approvals.web.views import DECIDE_PERMISSION, VIEW_PERMISSION


def _card_response(
    request: HttpRequest, approval_id: int, note: str, level: str, status: int
) -> HttpResponse:
    if not request.htmx:
        getattr(messages, level)(request, f"#{approval_id}: {note}")
        return redirect(reverse("approval-inbox"), permanent=False)
    approval = approvals_query(status="").get(id=approval_id)
    context = {
        "card": card_for(approval),
        "note": note,
        "note_level": level,
        "can_decide": request.user.has_perm(DECIDE_PERMISSION),
    }
    # a 2xx so htmx swaps the card in; the real status is in a header
    response = render(request, "approvals/_item.html", context)
    response["X-Claim-Status"] = str(status)
    response["HX-Trigger"] = "inbox-changed"
    return response


def _since(moment) -> str:
    return moment_text(moment) if moment else "earlier"


@require_POST
@login_required
def claim(request: HttpRequest, approval_id: int) -> HttpResponse:
    response = _claim_action(
        request, approval_id, claims.claim, "You are on it.", "{holder} is already on this item"
    )
    if request.POST.get("then") != "ticket":
        return response  # the card's own claim button: the card, swapped in place
    return _to_the_ticket(request, approval_id) or response


def _to_the_ticket(request: HttpRequest, approval_id: int) -> HttpResponse | None:
    """Taking a hand-over ("Take it and open the ticket") opens its ticket, where the person
    finishes it (refunds through the agent's own tool, replies, closes it). None when the item
    is no hand-over, has no ticket page, or is not the person's (the claim failed)."""
    approval = approvals_query(status="").filter(id=approval_id).first()
    if approval is None or approval.kind != ApprovalKind.HANDOVER:
        return None
    holder = approval.claimant()
    if approval.status != "pending" or holder is None or holder.pk != request.user.pk:
        return None
    url = record_url("ticket_id", ticket_id_of(approval))
    if not url:
        return None
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Redirect"] = url
        return response
    return redirect(url)


@require_POST
@login_required
def release(request: HttpRequest, approval_id: int) -> HttpResponse:
    return _claim_action(
        request,
        approval_id,
        claims.release,
        "Released: anyone may take it.",
        "{holder} holds this item, not you",
    )


def _claim_action(
    request: HttpRequest,
    approval_id: int,
    action: Callable[..., Approval],
    done_note: str,
    taken_note: str,
) -> HttpResponse:
    """Claim or release one card; `taken_note` names who holds it when that is someone else."""
    get_object_or_404(Approval, id=approval_id)
    if not request.user.has_perm(DECIDE_PERMISSION):
        return HttpResponse("You may look but not decide.", status=403)
    try:
        action(approval_id, user=request.user)
    except ClaimedByOther as exc:
        note = f"{taken_note.format(holder=exc.holder)} (since {_since(exc.since)})."
        return _card_response(request, approval_id, note, "warning", 409)
    except AlreadyDecided as exc:
        return _card_response(request, approval_id, f"Already decided: {exc}", "warning", 409)
    except DecisionError as exc:  # may decide but not see: a claim shows everything
        return HttpResponse(str(exc), status=403, content_type="text/plain; charset=utf-8")
    return _card_response(request, approval_id, done_note, "success", 200)


@require_POST
@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
def allow_operation(request: HttpRequest, approval_id: int) -> HttpResponse:
    """A lead allows one more execution of the item's operation key: someone who sees the inbox
    and holds `agentruns.operate_run` (checked first, so nobody else learns what the card holds;
    the service checks it again and records who, when and why on the item's run)."""
    if not request.user.has_perm(ALLOW_PERMISSION):
        return HttpResponse("You may not allow one more execution.", status=403)
    approval = get_object_or_404(Approval, id=approval_id)
    if not approval.operation_key:
        return _card_response(
            request, approval_id, "This call takes no operation key.", "warning", 409
        )
    try:
        run_services.allow_operation(
            approval.operation_key,
            user=request.user,
            reason=request.POST.get("reason", ""),
            run_id=approval.run_id,
        )
    except PermissionDenied as exc:
        return HttpResponse(str(exc), status=403, content_type="text/plain; charset=utf-8")
    except ActionRefused as exc:
        return _card_response(request, approval_id, f"Nothing changed: {exc}.", "warning", 409)
    note = "It may be done once more now: approving makes this call."
    return _card_response(request, approval_id, note, "success", 200)


def _selected(request: HttpRequest) -> dict[int, int]:
    """The selected items and the version of each the person saw (`"14.3"`; a bare id names
    no version, so it is refused as stale). BadId for anything that is not an id."""
    selected: dict[int, int] = {}
    for raw in request.POST.getlist("ids"):
        approval_id, version = parse_versioned_id(raw, what="selected item")
        selected.setdefault(approval_id, version or 0)
    return selected


@require_POST
@login_required
def bulk_decide(request: HttpRequest) -> HttpResponse:
    try:
        policy.check_may_decide(request.user)
    except DecisionError as exc:
        return HttpResponse(str(exc), status=403, content_type="text/plain; charset=utf-8")
    decision = request.POST.get("action", "")
    reason = request.POST.get("reason", "").strip()[:2000]
    internal_note = request.POST.get("internal_note", "").strip()[:2000]
    try:
        selected = _selected(request)
    except BadId as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    ids = list(selected)
    results: list[dict] = []
    if decision not in services.BULK_DECISIONS:
        results = [{"id": None, "ok": False, "code": "bad_request", "error": "Unknown action."}]
    elif not ids:
        results = [{"id": None, "ok": False, "code": "bad_request", "error": "Select items first."}]
    elif decision == "reject" and not reason and not internal_note:  # services.check_note
        results = [{"id": None, "ok": False, "code": "bad_request", "error": str(NoteRequired())}]
    else:
        ids = list(dict.fromkeys(ids))[: services.MAX_ITEMS]  # the inbox decides the first ones
        held = {}
        if not request.POST.get("override_claim"):
            rows = Approval.objects.select_related("claimed_by").filter(id__in=ids)
            held = {a.id: h for a in rows if (h := claims.held_by_other(a, request.user))}
        results = services.decide_many(
            ids,
            decision=decision,
            user=request.user,
            reason=reason,
            held=held,
            versions=selected,
            door=services.Door.INBOX,
            internal_note=internal_note,
        )
    if not request.htmx:
        for r in results:
            level = "success" if r["ok"] else "warning"
            getattr(messages, level)(request, _line(r))
        return redirect(reverse("approval-inbox"), permanent=False)
    response = render(
        request,
        "approvals/_bulk_results.html",
        {
            "results": [{**r, "text": _line(r)} for r in results],
            "summary": services.summary(results),
        },
    )
    response["HX-Trigger"] = "inbox-changed"
    return response


def _line(result: dict) -> str:
    where = f"#{result['id']}: " if result.get("id") else ""
    if result["ok"]:
        if result.get("code") == "needs_second_approver":
            return f"{where}your approval is recorded; it needs a second approver."
        return f"{where}{result['result']}."
    return f"{where}{result['error']}"


@require_GET
@login_required
@permission_required("approvals.view_approval", raise_exception=True)
def item(request: HttpRequest, approval_id: int) -> HttpResponse:
    """One item, whatever its state: the link in webhooks and mails (seen like the inbox)."""
    approval = get_object_or_404(approvals_query(status=""), id=approval_id)
    return render(
        request,
        "approvals/item.html",
        {"card": card_for(approval), "can_decide": request.user.has_perm(DECIDE_PERMISSION)},
    )
