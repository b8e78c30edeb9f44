"""Hand-overs a person finishes (issue 44, item 4): the trainee's run hands the request over; the
inbox item names and links its ticket; taking it opens the ticket, where the person refunds
through the refund agent's own tool (a run they start: same key, cap, approval rules and audit),
replies to the customer and closes it; the ticket then says who closed it with what. A trainee
still cannot refund. The real engine in-process, the refund tool calling the real gateway (one
daphne for the module), the gateway's ledger as the judge.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agentruns.models import OperationExecution, Run, RunStatus, Step
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval
from support.agents import request_ticket
from support.desk import actions
from support.models import Order, OutboxMessage, Ticket
from tests.helpers import ApiClient, advance
from tests.procs import gateway_refunds, module_web

pytestmark = pytest.mark.django_db(transaction=True)

TICKET, ORDER = "T-1001", "ORD-1001"
MESSAGE = "My blender arrived broken, please refund the whole order"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    with module_web(tmp_path_factory, django_db_blocker) as url:
        yield url


@pytest.fixture
def desk(seeded, gateway, settings) -> dict:
    settings.REFUND_GATEWAY_URL = gateway + "/gateway"
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0  # every refund is approved in the inbox
    return {u.username: u for u in get_user_model().objects.all()}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def handed_over(trainee) -> Approval:
    run_input = {"order_id": ORDER, "ticket_id": TICKET, "message": MESSAGE}
    run = advance(start_run("refund", run_input, user=trainee).run)
    assert (run.status, run.outcome) == (RunStatus.SUCCEEDED, "handed_over"), run.error
    return Approval.objects.get(run=run, kind="handover")


def token(page: str, name: str) -> str:
    return re.search(rf'name="{name}" value="([^"]+)"', page).group(1)


def ticket_page(client: Client) -> str:
    return client.get(f"/tickets/{TICKET}/").content.decode()


def test_a_handover_ends_on_its_ticket(desk, gateway):
    item = handed_over(desk["trainee"])
    approver = desk["approver"]
    # the item names its ticket (API) and links it and its run (the inbox card)
    listed = ApiClient(approver).get("/api/approvals?kind=handover").json()["approvals"]
    assert [(a["id"], a["ticket_id"]) for a in listed] == [(item.id, TICKET)]
    page = signed_in(approver)
    inbox = page.get("/approvals/").content.decode()
    card = inbox[inbox.index(f'id="approval-{item.id}"') :].split("</article>")[0]
    assert f'href="/tickets/{TICKET}/"' in card and f'href="/runs/{item.run_id}/"' in card
    assert "Take it and open ticket T-1001" in card

    # "Take it and open the ticket" opens the ticket (htmx: HX-Redirect); the card's own claim
    # button keeps the card in place
    taken = page.post(f"/approvals/{item.id}/claim/", {"then": "ticket"})
    assert (taken.status_code, taken["Location"]) == (302, f"/tickets/{TICKET}/")
    again = page.post(f"/approvals/{item.id}/claim/", {"then": "ticket"}, HTTP_HX_REQUEST="true")
    assert again["HX-Redirect"] == f"/tickets/{TICKET}/"
    in_place = page.post(f"/approvals/{item.id}/claim/", HTTP_HX_REQUEST="true")
    assert in_place["X-Claim-Status"] == "200" and "HX-Redirect" not in in_place
    html = ticket_page(page)
    assert 'id="ticket-state"' in html and "handed over: taken by approver" in html
    assert 'id="handover-refund"' in html and 'id="handover-reply"' in html
    assert 'id="handover-close"' in html

    # a refund by hand: the refund agent's own tool, approved in the inbox like any refund
    refund = page.post(
        f"/tickets/{TICKET}/handover/refund/",
        {
            "amount": "50.00",
            "reason": "we refund the broken jug",
            "refund_token": token(html, "refund_token"),
        },
    )
    assert refund.status_code == 302
    run = Run.objects.get(input__staff_refund__amount_cents=5000)
    assert run.created_by == approver and run.model == "scripted"
    twice = page.post(  # the same form again: the same run
        f"/tickets/{TICKET}/handover/refund/",
        {"amount": "50.00", "refund_token": token(html, "refund_token")},
    )
    assert (
        twice.status_code == 302
        and Run.objects.filter(input__staff_refund__isnull=False).count() == 1
    )
    run = advance(run)
    assert run.status == RunStatus.WAITING, run.error
    parked = Approval.objects.get(run=run, kind="approval", status="pending")
    assert parked.requested_args["amount_cents"] == 5000
    assert (
        parked.requested_args["ticket_id"] == TICKET and parked.operation_key == f"refund:{TICKET}"
    )
    decisions.approve(parked.id, user=desk["approver2"], version=1)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED and run.outcome == "partially_refunded", run.error
    assert [r["amount_cents"] for r in gateway_refunds(gateway, ORDER)] == [5000]
    assert OperationExecution.objects.get(key=f"refund:{TICKET}").state == "done"
    told = OutboxMessage.objects.get(run_id=run.id).body
    assert "we refunded 50.00 of" in told and "We refund the broken jug." in told

    # a reply in the person's own words, then the close with what they did
    html = ticket_page(page)
    sent = page.post(
        f"/tickets/{TICKET}/handover/reply/",
        {
            "text": "Hi Ada, the jug is refunded; keep the rest.",
            "reply_token": token(html, "reply_token"),
        },
    )
    assert sent.status_code == 302
    reply = OutboxMessage.objects.get(sent_by="approver")
    assert (
        reply.ticket.ticket_id == TICKET
        and reply.to == Order.objects.get(order_id=ORDER).customer_email
    )
    closed = page.post(f"/tickets/{TICKET}/handover/close/", {"note": "refunded the jug, replied"})
    assert closed.status_code == 302
    item.refresh_from_db()
    assert (item.status, item.resolution, item.decided_by) == ("resolved", "closed", approver)
    assert item.internal_note == "refunded the jug, replied"

    # the ticket shows who did what, and no longer waits for a colleague
    html = ticket_page(signed_in(desk["viewer"]))
    assert "hand-over closed by approver" in html
    assert 'Closed by <strong class="closer">approver</strong>' in html
    assert "refunded the jug, replied" in html and "Hi Ada, the jug is refunded" in html
    assert "waiting for a colleague" not in html and "taken by" not in html
    assert 'id="handover-close"' not in html


def test_a_handover_closed_through_the_api_shows_on_its_ticket(desk):
    item = handed_over(desk["trainee"])
    response = ApiClient(desk["approver2"]).post(
        f"/api/approvals/{item.id}", {"decision": "close", "internal_note": "called her back"}
    )
    assert response.status_code == 200 and response.json()["ticket_id"] == TICKET
    html = ticket_page(signed_in(desk["approver"]))
    assert "hand-over closed by approver2" in html and "called her back" in html
    assert "waiting for a colleague" not in html
    # whichever door closes it, the ticket is resolved by that person
    ticket = Ticket.objects.get(ticket_id=TICKET)
    assert (ticket.status, ticket.resolved_by) == ("resolved", desk["approver2"])
    assert 'id="ticket-status">resolved by approver2<' in html


def queue_rows(client: Client, query: str = "") -> dict[str, str]:
    """The queue page's rows by ticket id (each row's HTML)."""
    html = client.get(f"/tickets/{query}").content.decode()
    rows = re.findall(r'<tr data-ticket="([^"]+)"(.*?)</tr>', html, flags=re.S)
    return dict(rows)


def test_closing_a_handover_resolves_its_ticket_out_of_the_open_queue(desk):
    item = handed_over(desk["trainee"])
    approver = desk["approver"]
    page = signed_in(approver)
    # (the seed's 50 tickets are two pages: the oldest, T-1001, is found by its number)
    assert TICKET in queue_rows(page, f"?q={TICKET}")  # handed over, not finished: still open
    page.post(f"/tickets/{TICKET}/handover/take/")
    html = ticket_page(page)
    page.post(
        f"/tickets/{TICKET}/handover/reply/",
        {"text": "Hi, a colleague refunded you.", "reply_token": token(html, "reply_token")},
    )
    closed = page.post(f"/tickets/{TICKET}/handover/close/", {"note": "refunded by phone"})
    assert closed.status_code == 302

    # the close and the ticket's status, written together: who resolved it and when
    item.refresh_from_db()
    ticket = Ticket.objects.get(ticket_id=TICKET)
    assert (item.status, item.resolution) == ("resolved", "closed")
    assert (ticket.status, ticket.resolved_by, ticket.resolved_at) == (
        "resolved",
        approver,
        item.decided_at,
    )

    # the queue's open tickets leave it out; the resolved ones and every ticket show who did it
    viewer = signed_in(desk["viewer"])
    assert queue_rows(viewer, f"?q={TICKET}") == {}
    assert "T-1050" in queue_rows(viewer)  # (the seed's other open tickets stay)
    resolved = queue_rows(viewer, "?status=resolved")
    assert list(resolved) == [TICKET]
    assert '<span class="chip ticket-status">resolved by approver</span>' in resolved[TICKET]
    assert "resolved by approver" in queue_rows(viewer, f"?status=any&q={TICKET}")[TICKET]
    assert (
        "Resolved tickets, newest first" in viewer.get("/tickets/?status=resolved").content.decode()
    )
    html = ticket_page(viewer)
    assert 'id="ticket-status">resolved by approver<' in html
    assert "hand-over closed by approver" in html and "refunded by phone" in html
    # nothing on the page shows the status's field name or value as stored
    assert "resolved_by" not in html

    # the agent's "open ticket" of the order is no longer this one: a new request is
    another = ApiClient(approver).post(
        "/api/tickets", {"order_id": ORDER, "subject": "Another item", "body": "The lid too"}
    )
    assert another.status_code == 201
    order = Order.objects.get(order_id=ORDER)
    assert request_ticket(order).ticket_id == another.json()["ticket_id"]


def test_a_close_that_cannot_resolve_its_ticket_closes_nothing(desk, monkeypatch):
    item = handed_over(desk["trainee"])

    def broken(self, **kwargs):
        raise RuntimeError("the ticket could not be written")

    monkeypatch.setattr(Ticket, "resolve", broken)
    with pytest.raises(RuntimeError):
        decisions.close(item.id, user=desk["approver"], internal_note="refunded by phone")
    item.refresh_from_db()
    assert item.status == "pending" and item.decided_by is None
    assert Ticket.objects.get(ticket_id=TICKET).status == "open"


def test_a_trainee_still_cannot_refund(desk):
    trainee = desk["trainee"]
    item = handed_over(trainee)
    assert not actions.may_refund(trainee) and actions.may_refund(desk["approver"])
    page = signed_in(trainee)
    html = ticket_page(page)
    assert "Waiting for a colleague who may decide refunds." in html
    assert 'id="handover-refund"' not in html and 'id="handover-take"' not in html
    refused = page.post(
        f"/tickets/{TICKET}/handover/refund/", {"amount": "5.00", "refund_token": "t" * 24}
    )
    assert refused.status_code == 403
    assert page.post(f"/tickets/{TICKET}/handover/take/").status_code == 403
    # and a refund by hand they start anyway has no refund tool: nothing is paid, nothing handed
    # over again
    run_input = {"order_id": ORDER, "ticket_id": TICKET, "staff_refund": {"amount_cents": 500}}
    run = advance(start_run("refund", run_input, user=trainee, model="scripted").run)
    assert run.status == RunStatus.SUCCEEDED
    assert not Step.objects.filter(run=run, tool__in=["issue_refund", "hand_over"]).exists()
    assert Approval.objects.filter(kind="handover").count() == 1
    assert Approval.objects.get(id=item.id).status == "pending"


def test_a_refund_by_hand_is_held_to_what_is_left(desk):
    item = handed_over(desk["trainee"])
    page = signed_in(desk["approver"])
    page.post(f"/approvals/{item.id}/claim/")
    html = ticket_page(page)
    paid = Order.objects.get(order_id=ORDER).amount_cents
    too_much = f"{(paid + 1) // 100}.{(paid + 1) % 100:02d}"
    response = page.post(
        f"/tickets/{TICKET}/handover/refund/",
        {"amount": too_much, "refund_token": token(html, "refund_token")},
        follow=True,
    )
    assert "Nothing was done: at most" in response.content.decode()
    assert not Run.objects.filter(input__staff_refund__isnull=False).exists()
    assert Ticket.objects.get(ticket_id=TICKET).status == "open"
