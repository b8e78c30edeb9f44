"""The HTMX inbox: pending items newest first, decided in place."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from agentruns.registry import get_tool

from . import services
from .cards import card_for
from .models import Approval, ApprovalKind, ApprovalStatus
from .selectors import AGES, approvals_query

PAGE_SIZE = 25


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    filters = {
        "kind": request.GET.get("kind", "") if request.GET.get("kind") in ApprovalKind.values else "",
        "agent": request.GET.get("agent", ""),
        "age": request.GET.get("age", "") if request.GET.get("age") in AGES else "",
    }
    qs = approvals_query(status=ApprovalStatus.PENDING, **filters)
    page = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    recent = list(page.object_list)
    cards = [card_for(a) for a in recent]
    context = {
        "page": page,
        "cards": cards,
        "filters": filters,
        "kinds": ApprovalKind.values,
        "ages": list(AGES),
        "can_decide": request.user.has_perm("approvals.decide_approval"),
    }
    if request.htmx and request.GET.get("fragment") == "items":
        return render(request, "approvals/_items.html", context)
    return render(request, "approvals/inbox.html", context)


def _form_args(approval: Approval, post) -> dict | None:
    """Edited arguments from the form generated from the tool's schema (only changed fields)."""
    tool = get_tool(approval.tool)
    edited: dict = {}
    for name, prop in tool.parameters.get("properties", {}).items():
        field = f"arg_{name}"
        if field not in post:
            continue
        raw = post.get(field, "").strip()
        kind = prop.get("type")
        try:
            if kind == "integer":
                value = int(raw)
            elif kind == "number":
                value = float(raw)
            elif kind == "boolean":
                value = raw in ("1", "true", "on")
            elif kind in ("object", "array"):
                value = json.loads(raw)
            else:
                value = raw
        except (ValueError, json.JSONDecodeError):
            raise services.DecisionError(f"{name}: {raw!r} is not a valid {kind}") from None
        if approval.requested_args.get(name) != value:
            edited[name] = value
    return edited or None


@require_POST
@login_required
def decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(Approval.objects.select_related("run", "step"), id=approval_id)
    error = ""
    status = 200
    if not request.user.has_perm("approvals.decide_approval"):
        error, status = "You may look but not decide: ask a lead for the approver role.", 403
    else:
        action = request.POST.get("action", "")
        reason = request.POST.get("reason", "").strip()
        try:
            if action == "approve":
                services.approve(approval.id, user=request.user, edited_args=_form_args(approval, request.POST), reason=reason)
            elif action == "reject":
                services.reject(approval.id, user=request.user, reason=reason)
            elif action in services.RESOLUTIONS:
                raw = request.POST.get("result", "").strip()
                result = json.loads(raw) if raw else None
                services.reconcile(approval.id, user=request.user, resolution=action, result=result, reason=reason)
            else:
                error, status = "Unknown action.", 400
        except services.AlreadyDecided as exc:
            error, status = f"Nothing changed: this item was {exc}.", 409
        except services.DecisionError as exc:
            error, status = str(exc), 422
        except json.JSONDecodeError as exc:
            error, status = f"The result is not valid JSON: {exc}", 422
    approval.refresh_from_db()
    context = {"card": card_for(approval), "error": error, "can_decide": request.user.has_perm("approvals.decide_approval")}
    response = render(request, "approvals/_item.html", context, status=status if not request.htmx else 200)
    if request.htmx:
        response["HX-Trigger"] = "inbox-changed"
    return response
