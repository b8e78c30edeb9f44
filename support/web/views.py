"""The support desk: the ticket queue, a ticket with its order, "run the agent on it", and
finishing a hand-over on its ticket (take it, refund through the agent's own tool, reply to the
customer, close it: support/desk/actions.py).

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
from agentruns.runtime.values.money import BadAmount, format_cents, parse_major
from agentruns.web.forms.tokens import FIELD as TOKEN_FIELD
from agentruns.web.forms.tokens import BadFormToken, dedupe_key_of, new_form_token
from approvals.errors import DecisionError
from support import desk
from support.desk import actions
from support.models import Ticket

VIEW = "support.view_ticket"
START = "agentruns.start_run"
DECIDE = "approvals.decide_approval"
LOOK_INBOX = "approvals.view_approval"
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
    return get_object_or_404(
        Ticket.objects.select_related("order", "resolved_by"), ticket_id=ticket_id[:20]
    )


@require_GET
@login_required
@permission_required(VIEW, raise_exception=True)
def ticket_detail(request: HttpRequest, ticket_id: str) -> HttpResponse:
    view = desk.ticket_view(_ticket(ticket_id))
    handover = view.handover
    holder = handover.holder if handover is not None and handover.pending else None
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
            # the hand-over's actions are for whoever may decide; the one holding it acts
            "can_decide": request.user.has_perm(DECIDE) and request.user.has_perm(LOOK_INBOX),
            "mine": holder is not None and holder.pk == request.user.pk,
            "may_refund": actions.may_refund(request.user),
            "refund_token": new_form_token(),
            "reply_token": new_form_token(),
        },
    )


def _handover_action(request: HttpRequest, ticket_id: str, act) -> HttpResponse:
    """One action on the ticket's hand-over (`act(ticket, item)` returns the note to show),
    back to the ticket with its note; a refusal is shown there, never a 500."""
    ticket = _ticket(ticket_id)
    item = desk.ticket_handover(ticket, desk.ticket_runs(ticket))
    try:
        note = act(ticket, item.item if item is not None else None)
    except (actions.DeskRefused, BadFormToken, BadAmount, DecisionError) as exc:
        messages.error(request, f"Nothing was done: {exc}")
    except services.ActionRefused as exc:
        messages.error(request, f"The refund did not start: {exc}")
    else:
        messages.success(request, note)
    return redirect("ticket-detail", ticket_id=ticket.ticket_id)


@require_POST
@login_required
@permission_required(VIEW, raise_exception=True)
def handover_take(request: HttpRequest, ticket_id: str) -> HttpResponse:
    def take(ticket: Ticket, item) -> str:
        actions.held_handover(ticket, item, request.user)
        return "You have this hand-over: refund, reply to the customer, then close it."

    return _handover_action(request, ticket_id, take)


@require_POST
@login_required
@permission_required(VIEW, raise_exception=True)
def handover_refund(request: HttpRequest, ticket_id: str) -> HttpResponse:
    if not actions.may_refund(request.user):  # (the action checks it again)
        raise PermissionDenied("your tool policy does not allow refunds: ask a colleague who may")

    def refund(ticket: Ticket, item) -> str:
        cents = parse_major(request.POST.get("amount", ""))
        if cents < 1:
            raise BadAmount("the amount must be at least 0.01")
        result = actions.do_refund_by_hand(
            ticket,
            item,
            user=request.user,
            amount_cents=cents,
            reason=request.POST.get("reason", "").strip()[:500],
            key=dedupe_key_of(request.POST.get("refund_token")),
        )
        amount = format_cents(cents, ticket.order.currency)
        if not result.created:
            return f"This refund of {amount} was already asked for."
        return (
            f"Refund of {amount} asked for through the refund tool: an approver decides it in "
            "the inbox when the amount needs approval; the ticket shows it once it is made."
        )

    return _handover_action(request, ticket_id, refund)


@require_POST
@login_required
@permission_required(VIEW, raise_exception=True)
def handover_reply(request: HttpRequest, ticket_id: str) -> HttpResponse:
    def reply(ticket: Ticket, item) -> str:
        text = request.POST.get("text", "").strip()
        if not text:
            raise actions.DeskRefused("write the reply first")
        key = dedupe_key_of(request.POST.get("reply_token"))
        actions.do_reply(ticket, item, user=request.user, text=text[:5000], key=key)
        return "Your reply was sent to the customer."

    return _handover_action(request, ticket_id, reply)


@require_POST
@login_required
@permission_required(VIEW, raise_exception=True)
def handover_close(request: HttpRequest, ticket_id: str) -> HttpResponse:
    def close(ticket: Ticket, item) -> str:
        note = request.POST.get("note", "").strip()[:2000]
        if not note:
            raise actions.DeskRefused("say what you did, for your colleagues")
        actions.do_close(ticket, item, user=request.user, note=note)
        return "The hand-over is closed: the ticket shows who did what."

    return _handover_action(request, ticket_id, close)


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
