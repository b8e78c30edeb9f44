"""The HTMX inbox: pending items newest first, decided in place.

Viewing needs `approvals.view_approval` (as the API does); deciding needs
`approvals.decide_approval`. Decisions go through the one `services.decide` the JSON API calls
too, so the rules (limits, edit policies, the two-person rule, "already decided") and their
messages are identical (the inbox's one rule of its own, a reason to reject, is stated there);
the real status of a refusal rides in `X-Decision-Status`. Every page and fragment costs a
constant number of queries (see selectors/cards).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from agentruns.registry import all_agents
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.text import UnsafeValue, loads_strict
from agentruns.runtime.values.timestamps import moment_text
from agentruns.selectors.calls import argument_label
from agentruns.selectors.pagination import encode_cursor
from approvals import services
from approvals.domain.claims import held_by_other
from approvals.domain.context import keys_signature
from approvals.domain.selectors import AGES, InboxFilters, approvals_query, inbox_page
from approvals.errors import (
    AlreadyDecided,
    DecisionError,
    StaleProposal,
    status_of,
)
from approvals.models import Approval, ApprovalKind
from approvals.web.cards import build_cards, card_for
from approvals.web.forms import form_args, posted_version

PAGE_SIZE = 25
DECIDE_PERMISSION = "approvals.decide_approval"
VIEW_PERMISSION = "approvals.view_approval"


def _inbox_context(request: HttpRequest) -> dict[str, Any]:
    filters = InboxFilters.from_query(request.GET)
    page = inbox_page(
        filters, older=request.GET.get("older"), newer=request.GET.get("newer"), size=PAGE_SIZE
    )
    filter_query = {
        k: v
        for k, v in (
            ("kind", filters.kind),
            ("agent", filters.agent),
            ("age", filters.age),
            ("overdue", "1" if filters.overdue else ""),
        )
        if v
    }
    position = {}
    if not page.is_first and page.items:
        # the poll keeps showing this page: anchored just above its newest item
        position = {"older": _cursor_above(page)}
    can_decide = request.user.has_perm(DECIDE_PERMISSION)
    signature = page_signature(page, can_decide)
    if _is_poll(request) and request.GET.get("sig") == signature:
        return {"signature": signature, "unchanged": True}  # 204: skip the card reads
    cards = build_cards(page.shown)
    return {
        "signature": signature,
        "page": page,
        "overdue_cards": cards[: len(page.overdue)],
        "cards": cards[len(page.overdue) :],
        "filters": filters,
        "filter_query": urlencode(filter_query),
        "poll_query": urlencode({**filter_query, **position, "fragment": "items"}),
        "kinds": ApprovalKind.values,
        "ages": [(key, label) for key, (label, _) in AGES.items()],
        "agents": sorted(all_agents()),
        "can_decide": can_decide,
    }


def _is_poll(request: HttpRequest) -> bool:
    return bool(request.htmx) and request.GET.get("fragment") == "items"


def _cursor_above(page) -> str:
    first = page.items[0]
    head, _, pk = encode_cursor(first, rank="priority").rpartition("-")
    # "older than (priority, t, id+1)" includes the item itself; ids are unique so nothing else
    # sneaks in
    return f"{head}-{int(pk) + 1}"


def page_signature(page, can_decide: bool) -> str:
    """What the list shows, cheaply: items, their state (who holds them, overdue or not), the
    total, the state of their operation keys, and the minute (so the "waiting for" labels
    still move). The poll sends back the one it has; same -> 204. A claim taken or lapsed
    changes it, so everyone sees "taken by" live."""
    now = timezone.now()
    parts = [str(page.total), str(int(now.timestamp() // 60)), str(int(can_decide))]
    for a in page.shown:
        holder = a.claimant(now)
        parts.append(
            f"{a.id}:{a.status}:{a.version}:{holder.pk if holder else ''}:{int(a.is_overdue)}"
        )
    parts.append(keys_signature(page.shown))  # another run's call of an item's key
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


@require_GET
@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
def inbox(request: HttpRequest) -> HttpResponse:
    context = _inbox_context(request)
    if _is_poll(request):
        # the poll: nothing changed -> 204, which htmx leaves alone (no rendering, no swap)
        if context.get("unchanged"):
            return HttpResponse(status=204)
        # also refresh the navigation's count out of band
        return render(request, "approvals/_items.html", {**context, "oob": True})
    return render(request, "approvals/inbox.html", context)


DONE = {
    "happened": "Marked as happened; the run continues.",
    "retry": "Marked as not happened; the step runs again.",
    "abort": "The run was aborted.",
    "close": "Closed: the hand-over is done.",
}


def _rejected_note(reason: str, internal_note: str) -> str:
    told = (
        f"The agent is told “{reason}” and may pass it on to the customer."
        if reason
        else "The agent is told only that it was rejected."
    )
    kept = " Your internal note is kept for staff only." if internal_note else ""
    return f"Rejected. {told}{kept}"


def _decide(request: HttpRequest, approval: Approval) -> tuple[str, str]:
    """Apply the posted decision. Returns (level, message) for the person who clicked."""
    action = request.POST.get("action", "")
    if action == "answer":  # a question: free text, or the choice clicked
        answer = request.POST.get("answer", "")
        services.decide(approval.id, action, request.user, door=services.Door.INBOX, answer=answer)
        return "success", "Answered; the run continues with your answer."
    reason = request.POST.get("reason", "").strip()
    internal_note = request.POST.get("internal_note", "").strip()
    edited, result = None, None
    if action == "approve":
        edited = form_args(approval, request.POST)
    raw = request.POST.get("result", "").strip()
    if raw and action == "happened":
        try:
            result = loads_strict(raw, "result")
        except UnsafeValue as exc:
            raise DecisionError(f"The result is not valid JSON: {exc}") from None
    decided = services.decide(
        approval.id,
        action,
        request.user,
        edited_args=edited,
        reason=reason,
        # a reconciliation names no version: it is one person's answer to what happened
        version=posted_version(request) if action in ("approve", "reject") else None,
        result=result,
        door=services.Door.INBOX,
        internal_note=internal_note,
    )
    if action == "reject":
        return "success", _rejected_note(reason, internal_note)
    if action != "approve":
        return "success", DONE[action]
    if decided.status == "pending":
        return "success", (
            f"Your approval is {decided.approvals_given} of {decided.approvals_required}"
            f"{' (your edits started a new round)' if edited and decided.round > 1 else ''}; "
            "the run waits for another approver."
        )
    if decided.edited_args is not None:
        changes = ", ".join(
            f"{argument_label(k).lower()} {v['from']} → {v['to']}"
            for k, v in card_for(decided).diff.items()
        )
        return "success", f"Approved with changes ({changes}); the run continues."
    return "success", "Approved; the run continues."


@require_POST
@login_required
def decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(
        Approval.objects.select_related("run", "step", "decided_by", "claimed_by"), id=approval_id
    )
    can_decide = request.user.has_perm(DECIDE_PERMISSION)
    status = 200
    if not can_decide:
        level, note, status = (
            "error",
            "You may look but not decide: ask a lead for the approver role.",
            403,
        )
    elif (holder := held_by_other(approval, request.user)) and not request.POST.get(
        "override_claim"
    ):
        # the inbox asks "decide anyway?" first; a form without that answer changes nothing
        since = moment_text(approval.claimed_at)
        level, note, status = (
            "warning",
            f"Nothing changed: {actor_name(holder)} is on this item (since {since}). "
            "Confirm to decide it anyway.",
            409,
        )
    else:
        try:
            level, note = _decide(request, approval)
        except AlreadyDecided as exc:
            level, note, status = "warning", f"Nothing changed: this item was {_human(exc)}.", 409
        except StaleProposal as exc:
            level, note, status = (
                "warning",
                f"Nothing changed: {exc}. The card now shows the current proposal.",
                409,
            )
        except DecisionError as exc:
            level, note, status = "error", str(exc), status_of(exc)
    if not request.htmx:
        # plain form post (no JavaScript): the message survives the redirect back to the inbox
        getattr(messages, level)(request, f"#{approval.id} {approval.tool}: {note}")
        if not can_decide:
            return HttpResponse(note, status=403, content_type="text/plain; charset=utf-8")
        return redirect(reverse("approval-inbox"), permanent=False)
    approval = approvals_query(status="").get(id=approval.id)
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
        request, "approvals/_decided.html", context, status=200 if can_decide else 403
    )
    response["X-Decision-Status"] = str(status)
    response["HX-Trigger"] = "inbox-changed"
    return response


def _human(exc: AlreadyDecided) -> str:
    """ "already approved by alice at Dec 6, 14:02" for people (the API keeps ISO 8601)."""
    text = str(exc)
    if exc.when is not None:
        text = text.replace(exc.when.isoformat(timespec="seconds"), moment_text(exc.when))
    return text
