"""The support desk: the ticket queue, a ticket with its order, and "run the agent on it".

Looking needs `support.view_ticket`; running the agent goes through the same
`services.start_run` as every other door (which checks `agentruns.start_run`), with the input
built from the ticket (no JSON by hand) and the form's one-time token as its dedupe key, so a
double click starts one run.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from agentruns import services
from agentruns.web.forms.tokens import FIELD as TOKEN_FIELD
from agentruns.web.forms.tokens import dedupe_key_of, new_form_token
from support import desk
from support.models import Ticket

VIEW = "support.view_ticket"
START = "agentruns.start_run"
AGENT = "refund"  # the demo's agent: what "run the agent on this ticket" starts


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
def ticket_queue(request: HttpRequest) -> HttpResponse:
    filters = desk.TicketFilters.from_query(request.GET)
    page = desk.ticket_queue(
        filters, older=request.GET.get("older", ""), newer=request.GET.get("newer", "")
    )
    context = {
        "page": page,
        "filters": filters,
        "filter_query": urlencode(filters.as_params()),
        "statuses": desk.STATUSES,
    }
    template = "support/_ticket_rows.html" if request.htmx else "support/ticket_queue.html"
    return render(request, template, context)


def _ticket(ticket_id: str) -> Ticket:
    return get_object_or_404(Ticket.objects.select_related("order"), ticket_id=ticket_id[:20])


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
def ticket_detail(request: HttpRequest, ticket_id: str) -> HttpResponse:
    view = desk.ticket_view(_ticket(ticket_id))
    return render(
        request,
        "support/ticket.html",
        {
            "view": view,
            "ticket": view.ticket,
            "order": view.order,
            "can_start": request.user.has_perm(START),
            "form_token": new_form_token(),
            "token_field": TOKEN_FIELD,
        },
    )


def agent_input(ticket: Ticket) -> dict:
    """The refund agent's input for a ticket (DESIGN.md 6): the order, the ticket, and what the
    customer wrote."""
    return {
        "order_id": ticket.order.order_id,
        "ticket_id": ticket.ticket_id,
        "message": ticket.body or ticket.subject,
    }


@require_POST
@login_required
@permission_required(VIEW, raise_exception=True)
def ticket_run(request: HttpRequest, ticket_id: str) -> HttpResponse:
    if not request.user.has_perm(START):  # (the service checks it too, as for every door)
        raise PermissionDenied("running the agent needs agentruns.start_run: ask a lead")
    ticket = _ticket(ticket_id)
    try:
        key = dedupe_key_of(request.POST.get(TOKEN_FIELD))
        # PermissionDenied (the 403 page) and QuotaExceeded (the 429 page) pass through
        result = services.start_run(AGENT, agent_input(ticket), dedupe_key=key, user=request.user)
    except (ValueError, LookupError, services.ActionRefused) as exc:
        messages.error(request, f"The agent did not start: {exc}")
        return redirect("ticket-detail", ticket_id=ticket.ticket_id)
    if not result.created:  # (a new run: the run page's banner says the agent is working)
        messages.info(request, "This form was already sent: here is the run it started.")
    return redirect("run-detail", run_id=result.run.id)
