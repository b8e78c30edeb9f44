"""A fork repeats no side effect of its source without a person (agentruns/services/forks.py).

The source is a finished run of the demo's refund agent whose refund was rejected: it noted
that on the ticket (#5) and mailed the customer (#6), both asked for by the model turn #4. A
fork from #4 asks that turn again: the fork's confirmation (the API's preview, the fork's answer,
the page) lists #5 and #6, and the fork puts their tools under approval, so the executor parks
the calls in the inbox. Every test counts the outbox's and the ticket's own rows.
"""

from __future__ import annotations

import pytest
from django.test import Client

from agentruns.models import Run, RunStatus
from approvals.models import Approval
from support.models import OutboxMessage, TicketNote
from tests.helpers import ApiClient, advance, assert_json_error, events
from tests.testkit import NOTE_STEP, REPLY_STEP, REPLY_TURN, replied_run

pytestmark = pytest.mark.django_db

ORDER = "ORD-1007"
REPEATS = [
    {
        "index": NOTE_STEP,
        "tool": "add_ticket_note",
        "status": "succeeded",
        "idempotency": "key",
        "outcome_unknown": False,
        "approval": True,
    },
    {
        "index": REPLY_STEP,
        "tool": "send_customer_reply",
        "status": "succeeded",
        "idempotency": "none",
        "outcome_unknown": False,
        "approval": True,
    },
]


@pytest.fixture
def lead(seeded, django_user_model):
    return django_user_model.objects.get(username="lead")


@pytest.fixture
def source(lead) -> Run:
    run = replied_run(lead, order_id=ORDER)
    assert (mails(), notes()) == (1, 1)
    return run


def mails() -> int:
    return OutboxMessage.objects.filter(order__order_id=ORDER).count()


def notes() -> int:
    return TicketNote.objects.filter(ticket__order__order_id=ORDER).count()


def test_a_fork_from_the_turn_before_the_mail_parks_it_instead_of_mailing(source, lead):
    api = ApiClient(lead)
    preview = api.get(f"/api/runs/{source.id}/fork?from_step={REPLY_TURN}")
    assert preview.status_code == 200, preview.content
    assert preview.json() == {
        "run_id": str(source.id),
        "from_step": REPLY_TURN,
        "approve_repeats": True,
        "repeats": REPEATS,
        "approval_for": ["add_ticket_note", "send_customer_reply"],
    }
    assert Run.objects.count() == 1  # a preview starts nothing

    response = api.post(f"/api/runs/{source.id}/fork", {"from_step": REPLY_TURN})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["fork"]["repeats"] == REPEATS
    marked = body["permissions"]["tools"]["send_customer_reply"]
    assert marked["approval"] == "always" and f"step #{REPLY_STEP}" in marked["approval_because"]
    assert events(body["id"], "run.created")[0].data["repeats"] == REPEATS

    fork = advance(Run.objects.get(id=body["id"]))
    assert fork.status == RunStatus.WAITING, fork.error
    assert (mails(), notes()) == (1, 1)  # nothing repeated: the note waits for a person
    note = Approval.objects.get(run=fork, status="pending")
    assert note.tool == "add_ticket_note"
    inbox = Client()
    inbox.force_login(lead)
    card = inbox.get(f"/approvals/{note.id}/").content.decode()
    assert (
        f"Asked because the fork&#x27;s source run made this call at or after the cut (step #{NOTE_STEP})"
        in card
    )
    assert api.post(f"/api/approvals/{note.id}", {"decision": "approve"}).status_code == 200
    fork = advance(fork)
    assert (mails(), notes()) == (1, 2)  # approved: the note, and the mail waits in turn
    reply = Approval.objects.get(run=fork, status="pending")
    assert reply.tool == "send_customer_reply"
    rejected = api.post(
        f"/api/approvals/{reply.id}", {"decision": "reject", "reason": "already mailed"}
    )
    assert rejected.status_code == 200
    fork = advance(fork)
    assert fork.status == RunStatus.SUCCEEDED, fork.error
    assert mails() == 1


def test_the_confirmation_page_lists_the_repeats_and_opting_out_is_explicit(source, lead):
    client = Client()
    client.force_login(lead)
    run_page = client.get(f"/runs/{source.id}/").content.decode()
    assert f"/runs/{source.id}/fork/?from_step={REPLY_TURN}" in run_page
    page = client.get(f"/runs/{source.id}/fork/?from_step={REPLY_TURN}").content.decode()
    for repeat in REPEATS:
        assert f'data-step="{repeat["index"]}" data-tool="{repeat["tool"]}"' in page
    assert 'name="repeats" value="approve" checked' in page
    assert Run.objects.count() == 1

    # the person chose to let them run: the mail goes out again, as they said
    response = client.post(
        f"/runs/{source.id}/fork/", {"from_step": REPLY_TURN, "repeats": "allow"}
    )
    fork = Run.objects.exclude(id=source.id).get()
    assert response["Location"] == f"/runs/{fork.id}/"
    assert events(fork, "run.created")[0].data["approve_repeats"] is False
    fork = advance(fork)
    assert fork.status == RunStatus.SUCCEEDED, fork.error
    assert (mails(), notes()) == (2, 2)


def test_a_fork_after_the_side_effects_repeats_nothing(source, lead):
    last = source.step_count - 1  # the final answer
    api = ApiClient(lead)
    plan = api.get(f"/api/runs/{source.id}/fork?from_step={last}").json()
    assert plan["repeats"] == [] and plan["approval_for"] == []
    fork = api.post(f"/api/runs/{source.id}/fork", {"from_step": last}).json()
    assert fork["permissions"]["tools"]["send_customer_reply"]["approval"] == "tool"
    assert advance(Run.objects.get(id=fork["id"])).status == RunStatus.SUCCEEDED
    assert (mails(), notes()) == (1, 1)


def test_the_preview_refuses_what_a_fork_would(source, lead, django_user_model):
    api = ApiClient(lead)
    url = f"/api/runs/{source.id}/fork"
    assert "from_step is required" in assert_json_error(api.get(url), 400)["error"]
    assert_json_error(api.get(f"{url}?from_step=x"), 400)
    assert_json_error(api.get(f"{url}?from_step={NOTE_STEP}"), 409)  # a tool step
    assert_json_error(api.get(f"{url}?from_step=99"), 409)
    assert_json_error(
        api.get("/api/runs/00000000-0000-0000-0000-000000000000/fork?from_step=1"), 404
    )
    assert_json_error(api.get(f"{url}?from_step={REPLY_TURN}&approve_repeats=maybe"), 400)
    opted_out = api.get(f"{url}?from_step={REPLY_TURN}&approve_repeats=false").json()
    assert [r["approval"] for r in opted_out["repeats"]] == [False, False]
    assert opted_out["approval_for"] == []
    # the fork's confirmation is for those who may fork, as on the run page
    viewer = django_user_model.objects.get(username="viewer")  # may only look
    assert_json_error(ApiClient(viewer).get(f"{url}?from_step={REPLY_TURN}"), 403)
    assert_json_error(api.post(url, {"from_step": REPLY_TURN, "approve_repeats": "no"}), 400)
    assert Run.objects.count() == 1
