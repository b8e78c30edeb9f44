"""A hand-over is work for a person, never a note nobody reads (issue 34, item 4).

The demo's trainee may not refund (the seeded tool policy leaves `issue_refund` out): the run
hands the customer's request over (`hand_over`, a tool declared `handover=True`) and ends
`succeeded` with the outcome `handed_over`; when it ends, an inbox item of kind `handover` opens
through the runtime's inbox port, with the run's context (the customer's message, the order). A
person claims it and closes it with a note; the run's outcome stays. All on the real engine,
in-process, against PostgreSQL.
"""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agentruns.models import Run, RunStatus
from agentruns.runtime.execution import transitions
from agentruns.services import start_run
from approvals.domain.parking import withdraw_approvals
from approvals.models import Approval, ApprovalDecision, WebhookDelivery, WebhookEndpoint
from support.models import OutboxMessage, Ticket, TicketNote
from tests.helpers import ApiClient, advance, assert_json_error, events, steps

pytestmark = pytest.mark.django_db

MESSAGE = "My blender arrived broken, please refund the whole order"


def trainee_run(order_id: str = "ORD-1001") -> Run:
    trainee = get_user_model().objects.get(username="trainee")
    run = start_run("refund", {"order_id": order_id, "message": MESSAGE}, user=trainee).run
    return advance(run)


def test_a_trainees_run_hands_over_into_the_inbox_and_ends_handed_over(seeded):
    run = trainee_run()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outcome == "handed_over"
    assert "issue_refund" not in run.allowed_tools and "hand_over" in run.allowed_tools
    item = Approval.objects.get(run=run)
    step = next(s for s in steps(run, "tool") if s.tool == "hand_over")
    assert (item.kind, item.status, item.step_id) == ("handover", "pending", step.id)
    assert item.expires_at is None  # never falls through
    # the customer was told a colleague takes over, the ticket noted: no refund
    assert "A colleague will take over" in OutboxMessage.objects.get(run_id=run.id).body
    assert TicketNote.objects.filter(body__startswith="Hand-over:").count() == 1
    # the timeline: the item opened before the run's end, which carries the outcome
    requested = events(run, "approval.requested")[-1].data
    assert requested == {"step": step.index, "approval": item.id, "kind": "handover",
                         "tool": "hand_over"}  # fmt: skip
    assert events(run, "run.status")[-1].data["outcome"] == "handed_over"


def test_the_handover_is_listed_with_its_context_then_claimed_and_closed(seeded):
    run = trainee_run()
    item = Approval.objects.get(run=run)
    approver = get_user_model().objects.get(username="approver")
    api = ApiClient(approver)
    listed = api.get("/api/approvals?kind=handover").json()["approvals"]
    assert [a["id"] for a in listed] == [item.id]
    found = listed[0]
    assert found["kind"] == "handover" and found["status"] == "pending"
    assert found["summary"]["request"] == MESSAGE
    assert found["summary"]["order_id"] == "ORD-1001" and found["summary"]["customer"]
    context = found["context"]  # the order the run was about (the tool's declared context)
    assert context["order"]["order_id"] == "ORD-1001" and context["currency"] == "USD"
    assert context["refunds"] == [] and context["refunded_cents"] == 0
    assert found in api.get("/api/approvals").json()["approvals"]  # the default: pending

    # the inbox shows it as a hand-over, with the customer's words
    page = Client()
    page.force_login(approver)
    html = page.get("/approvals/").content.decode()
    assert f'id="approval-{item.id}"' in html and "kind-handover" in html
    assert "handed over" in html and MESSAGE in html and "Close the hand-over" in html

    claimed = api.post(f"/api/approvals/{item.id}/claim")
    assert claimed.status_code == 200 and claimed.json()["claimed_by"] == "approver"
    # it is no approval: approving or rejecting it is refused, and closing needs a note
    assert api.post(f"/api/approvals/{item.id}", {"decision": "approve"}).status_code == 422
    refused = assert_json_error(api.post(f"/api/approvals/{item.id}", {"decision": "close"}), 400)
    assert refused["fields"] == ["reason", "internal_note"]
    closed = api.post(
        f"/api/approvals/{item.id}",
        {"decision": "close", "internal_note": "refunded 50.00 by hand, customer agreed"},
    )
    assert closed.status_code == 200, closed.content
    body = closed.json()
    assert (body["status"], body["resolution"], body["decided_by"]) == (
        "resolved",
        "closed",
        "approver",
    )
    assert body["internal_note"] == "refunded 50.00 by hand, customer agreed"
    assert [d["decision"] for d in body["decisions"]] == ["close"]
    assert (
        api.post(f"/api/approvals/{item.id}", {"decision": "close", "reason": "x"}).status_code
        == 409
    )

    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.SUCCEEDED, "handed_over")  # it stays
    decided = events(run, "approval.decided")[-1].data
    assert decided["kind"] == "handover" and decided["decision"] == "closed"
    assert "refunded 50.00 by hand" not in json.dumps([e.data for e in events(run)])
    assert api.get("/api/approvals?kind=handover").json()["approvals"] == []


def test_closing_in_the_inbox_takes_the_note(seeded):
    run = trainee_run()
    item = Approval.objects.get(run=run)
    page = Client()
    page.force_login(get_user_model().objects.get(username="approver2"))
    hx = {"HTTP_HX_REQUEST": "true"}
    empty = page.post(f"/approvals/{item.id}/decide/", {"action": "close"}, **hx)
    assert empty["X-Decision-Status"] == "400"
    done = page.post(
        f"/approvals/{item.id}/decide/",
        {"action": "close", "internal_note": "called the customer, refund sent by hand"},
        **hx,
    )
    assert done["X-Decision-Status"] == "200", done.content.decode()
    assert "Closed: the hand-over is done." in done.content.decode()
    item.refresh_from_db()
    assert (item.status, item.resolution, item.decided_by.username) == (
        "resolved",
        "closed",
        "approver2",
    )
    row = ApprovalDecision.objects.get(approval=item)
    assert (row.decision, row.internal_note) == (
        "close",
        "called the customer, refund sent by hand",
    )
    # the run named no ticket: the order's open ticket, the one it handed over, is resolved
    # by the person who closed it in the inbox, and leaves the desk's open queue
    ticket = Ticket.objects.get(ticket_id="T-1001")
    assert (ticket.status, ticket.resolved_by.username) == ("resolved", "approver2")
    queue = page.get("/tickets/?q=T-1001").content.decode()
    assert 'data-ticket="T-1001"' not in queue
    resolved = page.get("/tickets/?status=resolved").content.decode()
    assert 'data-ticket="T-1001"' in resolved and "resolved by approver2" in resolved


def test_webhooks_hear_of_the_handover_opened_and_closed(seeded):
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", secret="whsec_" + "A" * 32)
    run = trainee_run()
    item = Approval.objects.get(run=run)
    lead = get_user_model().objects.get(username="lead")
    ApiClient(lead).post(
        f"/api/approvals/{item.id}", {"decision": "close", "internal_note": "done by hand"}
    )
    sent = list(WebhookDelivery.objects.filter(approval_id=item.id).order_by("id"))
    assert [d.event_type for d in sent] == ["handover.opened", "handover.closed"]
    closed = json.loads(sent[1].body)["data"]
    assert closed["approval"]["kind"] == "handover" and closed["approval"]["resolution"] == "closed"
    assert closed["run"]["id"] == str(run.id)
    assert "done by hand" not in sent[1].body  # the internal note stays in the app


def test_an_ended_run_opens_its_handover_once_and_nothing_withdraws_it(seeded):
    run = trainee_run()
    item = Approval.objects.get(run=run)
    # the run's end is written again (a retried run that ends once more): no second item
    transitions.apply(run.id, transitions.finished(RunStatus.SUCCEEDED, output=run.output))
    assert list(Approval.objects.filter(run=run).values_list("id", flat=True)) == [item.id]
    assert Run.objects.get(id=run.id).outcome == "handed_over"
    # a hand-over is a person's work, whatever becomes of the run (a cancel, an abort)
    assert withdraw_approvals(run, reason="run cancelled") == []
    item.refresh_from_db()
    assert item.status == "pending"


def test_the_run_page_and_the_ticket_show_the_handover_as_it_goes(seeded):
    run = trainee_run()
    item = Approval.objects.get(run=run)
    viewer, approver = (get_user_model().objects.get(username=u) for u in ("viewer", "approver"))
    page = Client()
    page.force_login(viewer)

    def handover_on_the_run_page() -> str:
        html = page.get(f"/runs/{run.id}/").content.decode()
        found = html[html.index('<div id="run-handovers">') :]
        # in the conversation, before the final answer and the engineering detail
        assert html.index('id="run-handovers"') < html.index('id="run-output"')
        return found[: found.index("<h3>Outcome</h3>")]

    waiting = handover_on_the_run_page()
    assert f'data-approval="{item.id}"' in waiting and "Handed over to a person" in waiting
    assert "waiting in the inbox" in waiting and f'href="/approvals/{item.id}/"' in waiting
    # no approval is waiting: the hand-over is not offered as one ("Waiting for approval")
    assert 'class="approval-card"' not in page.get(f"/runs/{run.id}/").content.decode()
    # the agent's reason for handing over, in the amount's currency
    assert "the customer asks for a refund of 247.11 USD; this run may not issue refunds" in waiting
    ApiClient(approver).post(f"/api/approvals/{item.id}/claim")
    assert "taken by approver" in handover_on_the_run_page()
    ApiClient(approver).post(
        f"/api/approvals/{item.id}", {"decision": "close", "internal_note": "refunded by hand"}
    )
    closed = handover_on_the_run_page()
    assert "closed by approver" in closed
    assert "internal note (staff only):</span> refunded by hand" in closed
    # the run's header and the ticket's runs say what the run came to
    html = page.get(f"/runs/{run.id}/").content.decode()
    assert 'id="run-outcome" class="chip outcome-attention"' in html
    ticket = Ticket.objects.filter(order__order_id="ORD-1001").first()
    desk = page.get(f"/tickets/{ticket.ticket_id}/").content.decode()
    row = desk[desk.index(f'<tr data-run-id="{run.id}">') :]
    row = row[: row.index("</tr>")]
    assert 'data-outcome="handed_over">handed over</span>' in row
    assert 'class="chip s-ended"' in row  # a success that is no good news is not green


def test_a_closed_handover_in_the_decided_view(seeded):
    run = trainee_run()
    item = Approval.objects.get(run=run)
    lead = get_user_model().objects.get(username="lead")
    ApiClient(lead).post(
        f"/api/approvals/{item.id}",
        {"decision": "close", "reason": "done", "internal_note": "refunded 20.00 by hand"},
    )
    page = Client()
    page.force_login(get_user_model().objects.get(username="viewer"))
    for search in ({}, {"kind": "handover"}, {"outcome": "closed"}, {"decider": "lead"}):
        html = page.get("/approvals/decided/", search).content.decode()
        assert f'id="decided-{item.id}"' in html, search
    assert (
        f'id="decided-{item.id}"'
        not in page.get("/approvals/decided/", {"outcome": "rejected"}).content.decode()
    )
    card = html[html.index(f'id="decided-{item.id}"') :]
    card = card[: card.index("</article>")]
    assert 'data-outcome="hand-over closed"' in card
    history = re.findall(r"<li>(.*?)</li>", card, re.S)
    assert len(history) == 2, history
    assert "the agent</strong> handed the request over to a person" in history[0]
    assert "<strong>lead</strong> closed the hand-over: “done”" in history[1]
    assert "internal note (staff only):</span> refunded 20.00 by hand" in history[1]
