"""The HTMX inbox: pending items newest first, decided in place.

Viewing needs a login; deciding needs `approvals.decide_approval`. Decisions go through the same
service functions as the JSON API, so the rules (limits, schema validation, "already decided")
are identical. Every page and fragment costs a constant number of queries (see selectors/cards).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from agentruns.registry import UnknownTool, all_agents, get_tool
from agentruns.selectors.pagination import encode_cursor
from agentruns.text import UnsafeValue, check_text, loads_strict
from approvals import services
from approvals.cards import build_cards, card_for
from approvals.models import Approval, ApprovalKind
from approvals.selectors import AGES, InboxFilters, inbox_page

PAGE_SIZE = 25
DECIDE_PERMISSION = "approvals.decide_approval"


def _inbox_context(request: HttpRequest) -> dict[str, Any]:
    filters = InboxFilters.from_query(request.GET)
    page = inbox_page(
        filters, older=request.GET.get("older"), newer=request.GET.get("newer"), size=PAGE_SIZE
    )
    filter_query = {
        k: v
        for k, v in (("kind", filters.kind), ("agent", filters.agent), ("age", filters.age))
        if v
    }
    position = {}
    if not page.is_first and page.items:
        # the poll keeps showing this page: anchored just above its newest item
        position = {"older": _cursor_above(page)}
    can_decide = request.user.has_perm(DECIDE_PERMISSION)
    signature = page_signature(page, can_decide)
    if request.htmx and request.GET.get("sig") == signature:
        return {"signature": signature}  # the caller answers 204: skip the card reads
    return {
        "signature": signature,
        "page": page,
        "cards": build_cards(page.items),
        "filters": filters,
        "filter_query": urlencode(filter_query),
        "poll_query": urlencode({**filter_query, **position, "fragment": "items"}),
        "kinds": ApprovalKind.values,
        "ages": [(key, label) for key, (label, _) in AGES.items()],
        "agents": sorted(all_agents()),
        "can_decide": can_decide,
    }


def _cursor_above(page) -> str:
    first = page.items[0]
    micros, _, pk = encode_cursor(first).partition("-")
    # "older than (t, id+1)" includes the item itself; ids are unique so nothing else sneaks in
    return f"{micros}-{int(pk) + 1}"


def page_signature(page, can_decide: bool) -> str:
    """What the list shows, cheaply: items, their state, the total, and the minute (so the
    "waiting for" labels still move). The poll sends back the one it has; same -> 204."""
    minute = int(timezone.now().timestamp() // 60)
    parts = [str(page.total), str(minute), str(int(can_decide))]
    parts += [f"{a.id}:{a.status}" for a in page.items]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


@require_GET
@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    context = _inbox_context(request)
    if request.htmx and request.GET.get("fragment") == "items":
        # the poll: nothing changed -> 204, which htmx leaves alone (no rendering, no swap)
        if request.GET.get("sig") and request.GET["sig"] == context["signature"]:
            return HttpResponse(status=204)
        # also refresh the navigation's count out of band
        return render(request, "approvals/_items.html", {**context, "oob": True})
    return render(request, "approvals/inbox.html", context)


def _parse_value(name: str, kind: str, raw: str) -> Any:
    """A form field as its schema type, by the API's rules (agentruns.text): ASCII digits only,
    finite numbers within 64 bits, strict JSON. ValueError for anything else."""
    if kind in ("integer", "number", "object", "array"):
        value = loads_strict(raw, name)
        if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(raw)
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(raw)
        return value
    if kind == "boolean":
        return raw in ("1", "true", "on")
    check_text(raw, name)
    return raw


def form_args(approval: Approval, post: QueryDict) -> dict | None:
    """Edited arguments from the form generated from the tool's schema (changed fields only).

    Fields the tool redacts are never in the form (the approver never saw their values), so they
    keep what the agent asked for.
    """
    try:
        properties = get_tool(approval.tool).parameters.get("properties", {})
    except UnknownTool:
        return None
    hidden = set(approval.hidden_fields)
    edited: dict = {}
    for name, prop in properties.items():
        field = f"arg_{name}"
        if name in hidden or (field not in post and f"present_{name}" not in post):
            continue
        kind = prop.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        raw = post.get(field, "").strip()
        if raw == "" and kind not in ("string", "boolean"):
            raise services.DecisionError(f"{name}: a value is required")
        try:
            value = _parse_value(name, kind, raw)
        except (ValueError, json.JSONDecodeError):
            raise services.DecisionError(f"{name}: {raw!r} is not a valid {kind}") from None
        if approval.requested_args.get(name) != value:
            edited[name] = value
    return edited or None


def _decide(request: HttpRequest, approval: Approval) -> tuple[str, str]:
    """Apply the posted decision. Returns (level, message) for the person who clicked."""
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "").strip()
    if action == "approve":
        edited = form_args(approval, request.POST)
        decided = services.approve(
            approval.id, user=request.user, edited_args=edited, reason=reason
        )
        if decided.edited_args is not None:
            changes = ", ".join(
                f"{k} {v['from']} → {v['to']}" for k, v in card_for(decided).diff.items()
            )
            return "success", f"Approved with changes ({changes}); the run continues."
        return "success", "Approved; the run continues."
    if action == "reject":
        if not reason:
            raise services.DecisionError(
                "Give a reason for the rejection: the agent passes it on to the customer."
            )
        services.reject(approval.id, user=request.user, reason=reason)
        return "success", f"Rejected: “{reason}”. The agent will tell the customer."
    if action in services.RESOLUTIONS:
        raw = request.POST.get("result", "").strip()
        try:
            result = loads_strict(raw, "result") if raw and action == "happened" else None
        except UnsafeValue as exc:
            raise services.DecisionError(f"The result is not valid JSON: {exc}") from None
        services.reconcile(
            approval.id, user=request.user, resolution=action, result=result, reason=reason
        )
        return "success", {
            "happened": "Marked as happened; the run continues.",
            "retry": "Marked as not happened; the step runs again.",
            "abort": "The run was aborted.",
        }[action]
    raise services.DecisionError("Unknown action.")


@require_POST
@login_required
def decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(
        Approval.objects.select_related("run", "step", "decided_by"), id=approval_id
    )
    can_decide = request.user.has_perm(DECIDE_PERMISSION)
    status = 200
    if not can_decide:
        level, note, status = (
            "error",
            "You may look but not decide: ask a lead for the approver role.",
            403,
        )
    else:
        try:
            level, note = _decide(request, approval)
        except services.AlreadyDecided as exc:
            level, note, status = "warning", f"Nothing changed: this item was {_human(exc)}.", 409
        except services.DecisionError as exc:
            level, note, status = "error", str(exc), 422
    if not request.htmx:
        # plain form post (no JavaScript): the message survives the redirect back to the inbox
        getattr(messages, level)(request, f"#{approval.id} {approval.tool}: {note}")
        if status == 403:
            return HttpResponse(note, status=403, content_type="text/plain; charset=utf-8")
        return redirect(reverse("approval-inbox"), permanent=False)
    approval = Approval.objects.select_related("run", "step", "decided_by").get(id=approval.id)
    context = {
        "card": card_for(approval),
        "note": note,
        "note_level": level,
        "can_decide": can_decide,
        "oob": True,
    }
    # htmx only swaps 2xx answers: a refused or late decision is still shown in place, with the
    # real status kept in a header for scripts and tests
    response = render(
        request, "approvals/_decided.html", context, status=403 if status == 403 else 200
    )
    response["X-Decision-Status"] = str(status)
    response["HX-Trigger"] = "inbox-changed"
    return response


def _human(exc: services.AlreadyDecided) -> str:
    """ "already approved by alice at 14:02:07 UTC" for people (the API keeps ISO 8601)."""
    text = str(exc)
    if exc.when is not None:
        local = timezone.localtime(exc.when)
        text = text.replace(
            exc.when.isoformat(timespec="seconds"), local.strftime("%H:%M:%S %Z on %Y-%m-%d")
        )
    return text
