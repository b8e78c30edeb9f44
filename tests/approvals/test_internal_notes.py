"""Words that are safe to send a customer (issue 34, item 3).

Rejecting takes the reason the agent is told (and may pass on) and/or an internal note for staff
only: at least one of the two in every door but the chat. The note is kept in the audit trail
(the item, its decision rows, the API, the run page) and reaches nothing the model or the
customer sees: checked on the demo's real scripted refund flow, recording every conversation
the model is sent, every reply mailed to the customer, the run's output, events and webhooks.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from agentruns.models import Run, RunEvent, RunStatus, Step
from agentruns.registry import get_agent
from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval, ApprovalDecision, WebhookDelivery, WebhookEndpoint
from support.models import OutboxMessage, TicketNote
from tests.approvals.kit import CRASH_NEXT, die_mid_call_then_recover
from tests.helpers import ApiClient, advance, assert_json_error

pytestmark = pytest.mark.django_db

NOTE = "INTERNAL-7f3a: customer flagged twice for chargebacks, see case 4711"
REASON = "the order is outside the 30-day return window"


@pytest.fixture
def sent_to_model(monkeypatch) -> list[list[dict]]:
    """Every conversation the refund agent's model is sent (the scripted model's FunctionModel
    hands its policy the request's messages): recorded, then answered as before."""
    agent = get_agent("refund")
    policy, seen = agent.scripted_policy, []

    def recording(messages: list[dict], tools: list[str] | None = None):
        seen.append(json.loads(json.dumps(messages)))
        return policy(messages, tools=tools)

    monkeypatch.setattr(agent, "scripted_policy", recording)
    return seen


def parked_refund(order_id: str = "ORD-1007") -> Run:
    lead = get_user_model().objects.get(username="lead")
    run = start_run(
        "refund", {"order_id": order_id, "message": "It broke, refund please"}, user=lead
    )
    run = advance(run.run)
    assert run.status == RunStatus.WAITING, run.error
    return run


def everything_the_model_and_the_customer_got(run: Run, sent: list[list[dict]]) -> str:
    """The model's requests, the run's stored conversation (every step's words and data), the
    customer's mail, the ticket, the output, the timeline and the webhooks, as one text."""
    parts = [json.dumps(sent)]
    for step in Step.objects.filter(run=run):
        parts += [step.text, step.error, json.dumps(step.arguments), json.dumps(step.result)]
    parts += [m.body for m in OutboxMessage.objects.filter(run_id=run.id)]
    parts += [n.body for n in TicketNote.objects.all()]
    parts += [Run.objects.get(id=run.id).output]
    parts += [json.dumps(e.data) for e in RunEvent.objects.filter(run=run)]
    parts += [d.body for d in WebhookDelivery.objects.all()]
    return "\n".join(parts)


def test_an_internal_note_never_reaches_the_model_or_the_customer(seeded, sent_to_model):
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", secret="whsec_" + "A" * 32)
    run = parked_refund()
    item = Approval.objects.get(run=run)
    approver = get_user_model().objects.get(username="approver")
    rejected = ApiClient(approver).post(
        f"/api/approvals/{item.id}",
        {"decision": "reject", "reason": REASON, "internal_note": NOTE, "version": 1},
    )
    assert rejected.status_code == 200, rejected.content
    assert (rejected.json()["reason"], rejected.json()["internal_note"]) == (REASON, NOTE)
    run = advance(run)
    assert (run.status, run.outcome) == (RunStatus.SUCCEEDED, "refund_rejected")

    # the model was asked again after the rejection, and told the reason only
    told = [m for m in sent_to_model[-1] if m["role"] == "tool" and "rejected" in m["content"]]
    assert [json.loads(m["content"]) for m in told] == [{"error": "rejected", "reason": REASON}]
    seen = everything_the_model_and_the_customer_got(run, sent_to_model)
    assert "INTERNAL-7f3a" not in seen and "chargebacks" not in seen
    reply = OutboxMessage.objects.get(run_id=run.id).body
    assert f"we could not approve a refund for order ORD-1007: {REASON}." in reply

    # ... and it is in the audit trail: the item, its decision row, the API, the run page
    item.refresh_from_db()
    assert (item.status, item.reason, item.internal_note) == ("rejected", REASON, NOTE)
    row = ApprovalDecision.objects.get(approval=item)
    assert (row.decision, row.reason, row.internal_note) == ("reject", REASON, NOTE)
    listed = ApiClient(approver).get("/api/approvals?status=rejected").json()["approvals"]
    assert listed[0]["internal_note"] == NOTE
    assert listed[0]["decisions"][0]["internal_note"] == NOTE
    page = Client()
    page.force_login(approver)
    html = page.get(f"/runs/{run.id}/").content.decode()
    # in the run page's conversation (not only in the engineering detail), labelled for staff
    said = html[html.index('<div id="approval-card">') : html.index('id="engineering"')]
    assert "by approver" in said and f'the agent was told: <span class="told">“{REASON}”' in said
    assert f"internal note (staff only):</span> {NOTE}" in said
    assert NOTE in page.get(f"/approvals/{item.id}/").content.decode()


def test_a_note_alone_rejects_and_the_agent_is_told_no_reason(seeded, sent_to_model):
    run = parked_refund("ORD-1008")
    item = Approval.objects.get(run=run)
    lead = get_user_model().objects.get(username="lead")
    page = Client()
    page.force_login(lead)
    response = page.post(
        f"/approvals/{item.id}/decide/",
        {"version": "1", "action": "reject", "internal_note": NOTE},
        HTTP_HX_REQUEST="true",
    )
    assert response["X-Decision-Status"] == "200", response.content.decode()
    assert "The agent is told only that it was rejected" in response.content.decode()
    run = advance(run)
    assert run.outcome == "refund_rejected"
    assert "INTERNAL-7f3a" not in everything_the_model_and_the_customer_got(run, sent_to_model)
    reply = OutboxMessage.objects.get(run_id=run.id).body
    assert "we could not approve a refund for order ORD-1008. Reply" in reply
    assert Approval.objects.get(id=item.id).reason == ""


def test_rejecting_needs_a_reason_or_a_note_in_every_door_but_the_chat(seeded):
    run = parked_refund("ORD-1009")
    item = Approval.objects.get(run=run)
    lead = get_user_model().objects.get(username="lead")
    api = ApiClient(lead)
    single = assert_json_error(
        api.post(f"/api/approvals/{item.id}", {"decision": "reject", "reason": "  "}), 400
    )
    assert (single["code"], single["fields"]) == ("note_required", ["reason", "internal_note"])
    bulk = assert_json_error(
        api.post("/api/approvals/bulk", {"ids": [item.id], "decision": "reject"}), 400
    )
    assert bulk["fields"] == ["reason", "internal_note"]
    page = Client()
    page.force_login(lead)
    refused = page.post(
        "/approvals/bulk/", {"ids": [f"{item.id}.1"], "action": "reject"}, HTTP_HX_REQUEST="true"
    )
    assert "Give a reason" in refused.content.decode()
    assert Approval.objects.get(id=item.id).status == "pending"
    # the inbox's bulk rejection takes a note alone, kept on the item
    done = page.post(
        "/approvals/bulk/",
        {"ids": [f"{item.id}.1"], "action": "reject", "internal_note": NOTE},
        HTTP_HX_REQUEST="true",
    )
    assert "rejected" in done.content.decode()
    item.refresh_from_db()
    assert (item.status, item.reason, item.internal_note) == ("rejected", "", NOTE)
    # the chat's answer has no field for a note: a rejection there needs nothing
    from approvals.services import Door, check_note

    check_note("reject", "", "", Door.CHAT)


def test_the_inbox_form_says_which_is_which(seeded):
    run = parked_refund("ORD-1010")
    item = Approval.objects.get(run=run)
    page = Client()
    page.force_login(get_user_model().objects.get(username="approver"))
    html = page.get("/approvals/").content.decode()
    assert f'<label for="a{item.id}-told">Reason for the customer' in html
    assert "the agent is told this and may pass it on to the customer" in html
    assert f'<label for="a{item.id}-note">Internal note' in html
    assert (
        "for staff only: kept in the audit trail, never shown to the agent or the customer" in html
    )
    assert 'name="internal_note"' in html and '<label for="bulk-note">Internal note' in html


def test_the_note_of_an_approval_stays_in_the_history_when_its_call_is_reconciled(approver):
    run = start_run(
        "ap-wire",
        {"script": [{"calls": [["ap_wire", {"account": "DE00-1", "amount_cents": 700}]]}]},
    ).run
    approval = Approval.objects.get(run=advance(run))
    decisions.approve(approval.id, user=approver, internal_note=NOTE)
    CRASH_NEXT["ap_wire"] = True
    run = die_mid_call_then_recover(run)
    item = Approval.objects.get(run=run)  # the same row, now a reconciliation
    assert item.kind == "reconciliation" and item.internal_note == ""
    assert item.history[0]["internal_note"] == NOTE
    listed = ApiClient(approver).get("/api/approvals").json()["approvals"]
    assert listed[0]["history"][0]["internal_note"] == NOTE
    page = Client()
    page.force_login(approver)
    assert NOTE in page.get("/approvals/?kind=reconciliation").content.decode()
    assert "INTERNAL-7f3a" not in json.dumps([e.data for e in RunEvent.objects.filter(run=run)])


def test_the_decided_view_shows_staff_the_note_beside_the_reason(seeded):
    run = parked_refund("ORD-1011")
    item = Approval.objects.get(run=run)
    approver = get_user_model().objects.get(username="approver")
    decisions.decide(item.id, "reject", approver, reason=REASON, internal_note=NOTE, version=1)
    page = Client()
    page.force_login(get_user_model().objects.get(username="viewer"))
    html = page.get("/approvals/decided/", {"outcome": "rejected"}).content.decode()
    card = html[html.index(f'id="decided-{item.id}"') :]
    card = card[: card.index("</article>")]
    said = card[card.index('class="history"') :]
    assert f"<strong>approver</strong> rejected: “{REASON}”" in said
    assert f"internal note (staff only):</span> {NOTE}" in said
    # the ticket's conversation (what the customer was sent) carries no note
    ticket = page.get("/tickets/T-1011/")
    assert ticket.status_code == 200 and "INTERNAL-7f3a" not in ticket.content.decode()
