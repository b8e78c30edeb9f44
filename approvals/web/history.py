"""The inbox's decided view: decided items, the newest decision first, searchable, each with
its history (`approvals/domain/history.py`). Needs `approvals.view_approval`, like the inbox."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from approvals.domain.history import (
    OUTCOMES,
    HistoryEntry,
    HistoryFilters,
    decided_page,
    history_of,
)
from approvals.models import ApprovalKind
from approvals.web.arguments import shown_diff
from approvals.web.cards import Card, build_cards
from approvals.web.views import PAGE_SIZE, VIEW_PERMISSION


@dataclass
class DecidedItem:
    card: Card
    outcome: str  # in words: "approved with edits", "reconciled: happened", ...
    tone: str  # the chip's colour: succeeded | failed | waiting
    history: list[HistoryEntry]


def _outcome(card: Card) -> tuple[str, str]:
    a = card.approval
    if a.kind == ApprovalKind.HANDOVER and a.status == "resolved":
        return "hand-over closed", "succeeded"
    if a.resolution == "withdrawn":
        return "withdrawn", "skipped"
    if a.resolution:
        return f"reconciled: {a.resolution}", "failed" if a.resolution == "abort" else "succeeded"
    if card.not_made_label:  # approved, and nothing happened: never a green "approved"
        return card.not_made_label, "failed"
    if a.status == "approved":
        return ("approved with edits" if a.edited_args is not None else "approved"), "succeeded"
    return a.status, "failed"


@require_GET
@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
def decided(request: HttpRequest) -> HttpResponse:
    filters = HistoryFilters.from_query(request.GET)
    page = decided_page(
        filters, older=request.GET.get("older"), newer=request.GET.get("newer"), size=PAGE_SIZE
    )
    items = []
    for card in build_cards(page.items):
        outcome, tone = _outcome(card)
        entries = history_of(card.approval)
        for entry in entries:  # an edited amount in its currency, as on the card
            if entry.diff:
                entry.diff = shown_diff(entry.diff, card.money)
        items.append(DecidedItem(card, outcome, tone, entries))
    context = {
        "page": page,
        "items": items,
        "filters": filters,
        "filter_query": urlencode(filters.as_params()),
        "kinds": ApprovalKind.values,
        "outcomes": [(key, label) for key, (label, _) in OUTCOMES.items()],
    }
    template = "approvals/_decided_rows.html" if request.htmx else "approvals/decided.html"
    return render(request, template, context)
