"""The HTMX inbox: what a card shows, CSRF, permissions, decisions, filters, pagination, and a
constant query count per page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentruns.models import Run, RunStatus, Step
from approvals.models import Approval, ApprovalKind, ApprovalStatus

from .kit import SECRET, bulk_pending, login, parked_approval, unknown_step_approval

pytestmark = pytest.mark.django_db

INBOX = "/approvals/"
HX = {"HTTP_HX_REQUEST": "true"}


def decide_url(approval: Approval) -> str:
    return reverse("approval-decide", args=[approval.id])


def csrf_client(user) -> tuple[Client, str]:
    """A client that enforces CSRF like a browser session, and the token the inbox page gave it."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(INBOX)
    assert page.status_code == 200
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    return client, token.group(1) if token else client.cookies["csrftoken"].value


def test_login_required(client):
    response = client.get(INBOX)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    approval = parked_approval()
    response = client.post(decide_url(approval), {"version": "1", "action": "approve"})
    assert response.status_code == 302
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


def test_card_shows_what_a_person_needs_to_decide(client, approver):
    approval = parked_approval(message="The blender arrived broken, please refund")
    html = login(client, approver).get(INBOX).content.decode()
    assert "Ada Lovelace" in html  # customer, from the run's own lookup result
    assert "ORD-1001" in html
    assert "45.99 EUR" in html  # amount and currency
    assert "The blender arrived broken" in html  # the agent's stated reason
    assert (
        "The customer is owed 45.99 EUR, so I will issue that refund." in html
    )  # recent model text
    assert "Let me look up order ORD-1001 first." in html
    assert "please refund" in html  # the request
    assert "ap_refund" in html
    assert SECRET not in html  # redacted argument
    assert reverse("run-detail", args=[approval.run_id]) in html
    assert 'class="waited"' in html
    assert f'id="decide-{approval.id}"' in html and 'name="arg_amount_cents"' in html
    assert 'name="arg_card_token"' not in html  # a redacted field is not editable
    # form attributes from the JSON schema, narrowed by the edit policy (may only go down), in
    # the call's currency (the amount is typed as 12.50, issue 34)
    assert 'min="0.01"' in html and 'max="45.99"' in html and 'value="45.99"' in html
    assert 'name="unit_amount_cents" value="EUR"' in html
    assert "may only be lowered: from 0.01 up to 45.99 EUR (the requested value)" in html


def test_viewer_sees_but_cannot_decide_in_the_ui(approver, viewer):
    approval = parked_approval()
    client, token = csrf_client(viewer)
    html = client.get(INBOX).content.decode()
    assert "ORD-1001" in html and f'id="decide-{approval.id}"' not in html
    for extra in ({}, HX):
        response = client.post(
            decide_url(approval),
            {"version": "1", "action": "approve", "csrfmiddlewaretoken": token},
            **extra,
        )
        assert response.status_code == 403
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    assert Run.objects.get(id=approval.run_id).status == RunStatus.WAITING


def test_post_without_csrf_token_is_refused(approver):
    approval = parked_approval()
    client, token = csrf_client(approver)
    response = client.post(decide_url(approval), {"version": "1", "action": "approve"}, **HX)
    assert response.status_code == 403
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    response = client.post(
        decide_url(approval), {"version": "1", "action": "approve"}, HTTP_X_CSRFTOKEN=token, **HX
    )
    assert response.status_code == 200
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.APPROVED


def test_htmx_approve_swaps_the_card_and_updates_the_nav_count(approver):
    approval, other = parked_approval(), parked_approval()
    client, token = csrf_client(approver)
    assert re.search(r'id="nav-pending">2<', client.get(INBOX).content.decode())
    response = client.post(
        decide_url(approval),
        {"version": "1", "action": "approve", "csrfmiddlewaretoken": token},
        **HX,
    )
    html = response.content.decode()
    assert response.status_code == 200 and response["HX-Trigger"] == "inbox-changed"
    assert "Approved; the run continues." in html
    assert re.search(r'id="nav-pending" hx-swap-oob="true">1<', html)
    assert 'hx-swap-oob="afterbegin:#decision-log"' in html
    assert Run.objects.get(id=approval.run_id).status == RunStatus.QUEUED
    # decided items leave the list; the poll fragment says so
    fragment = client.get(INBOX + "?fragment=items", **HX).content.decode()
    assert (
        f'id="approval-{approval.id}"' not in fragment and f'id="approval-{other.id}"' in fragment
    )
    assert re.search(r'id="pending-count">1<', fragment)


def test_edit_form_approves_with_changed_args_and_shows_the_diff(approver):
    approval = parked_approval(amount=4599)
    client, token = csrf_client(approver)
    response = client.post(
        decide_url(approval),
        {
            "version": "1",
            "action": "approve",
            "csrfmiddlewaretoken": token,
            "arg_order_id": "ORD-1001",
            "arg_amount_cents": "2500",
            "arg_reason": "The blender arrived broken",
            "reason": "only the lid",
        },
        **HX,
    )
    html = response.content.decode()
    assert "amount 45.99 EUR → 25.00 EUR" in html  # in the currency (issue 34)
    approval.refresh_from_db()
    assert (
        approval.status == ApprovalStatus.APPROVED and approval.edited_args["amount_cents"] == 2500
    )
    assert approval.edited_args["card_token"] == SECRET  # the hidden field kept its requested value
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == 2500


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"arg_amount_cents": "twelve"}, "amount_cents must be an integer"),
        ({"arg_amount_cents": "0"}, "amount_cents must be at least 1"),
        ({"arg_order_id": "ORDER 5"}, "order_id may not be changed"),
    ],
)
def test_invalid_edits_are_explained_and_nothing_changes(approver, fields, message):
    approval = parked_approval()
    client, token = csrf_client(approver)
    response = client.post(
        decide_url(approval),
        {"version": "1", "action": "approve", "csrfmiddlewaretoken": token, **fields},
        **HX,
    )
    assert message in response.content.decode()
    assert response["X-Decision-Status"] == "400"  # an edit outside the policy (DESIGN.md 6)
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


def test_reject_needs_a_reason_in_the_ui(approver):
    approval = parked_approval()
    client, token = csrf_client(approver)
    response = client.post(
        decide_url(approval),
        {"version": "1", "action": "reject", "csrfmiddlewaretoken": token},
        **HX,
    )
    assert "Give a reason" in response.content.decode()
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    client.post(
        decide_url(approval),
        {
            "version": "1",
            "action": "reject",
            "reason": "already refunded",
            "csrfmiddlewaretoken": token,
        },
        **HX,
    )
    step = Step.objects.get(id=approval.step_id)
    assert step.result == {"error": "rejected", "reason": "already refunded"}


def test_second_decision_tells_the_loser_who_decided_and_when(approver, lead):
    approval = parked_approval()
    first, first_token = csrf_client(approver)
    second, second_token = csrf_client(lead)
    first.post(
        decide_url(approval),
        {"version": "1", "action": "approve", "csrfmiddlewaretoken": first_token},
        **HX,
    )
    response = second.post(
        decide_url(approval),
        {"version": "1", "action": "reject", "reason": "x", "csrfmiddlewaretoken": second_token},
        **HX,
    )
    html = response.content.decode()
    assert response["X-Decision-Status"] == "409"
    assert re.search(
        r"Nothing changed: this item was already approved by approver at [A-Z][a-z]{2} \d{1,2}, "
        r"\d\d:\d\d\.",
        html,
    )
    # without JavaScript: redirected back to the inbox with the same message
    response = second.post(
        decide_url(approval),
        {"version": "1", "action": "approve", "csrfmiddlewaretoken": second_token},
        follow=True,
    )
    assert "already approved by approver" in response.content.decode()
    assert Approval.objects.get(id=approval.id).decided_by.username == "approver"


def test_approver_limit_message_in_the_ui(approver, settings):
    settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 3000
    approval = parked_approval(amount=4599)
    client, token = csrf_client(approver)
    response = client.post(
        decide_url(approval),
        {"version": "1", "action": "approve", "csrfmiddlewaretoken": token},
        **HX,
    )
    assert "45.99 is above your approval limit of 30.00" in response.content.decode()
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


@pytest.mark.parametrize(
    "action, run_status",
    [("happened", RunStatus.QUEUED), ("retry", RunStatus.QUEUED), ("abort", RunStatus.FAILED)],
)
def test_reconciliation_choices_in_the_ui(approver, action, run_status):
    approval = unknown_step_approval()
    client, token = csrf_client(approver)
    html = client.get(INBOX).content.decode()
    assert "outcome unknown" in html and "attempt 1 started" in html
    assert "It happened" in html and "It did not happen: retry" in html and "Abort the run" in html
    data = {"action": action, "csrfmiddlewaretoken": token}
    if action == "happened":
        data["result"] = '{"sent": "ada@example.com"}'
    response = client.post(decide_url(approval), data, **HX)
    assert response.status_code == 200, response.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.RESOLVED and approval.resolution == action
    assert Run.objects.get(id=approval.run_id).status == run_status
    if action == "happened":
        assert Step.objects.get(id=approval.step_id).result == {"sent": "ada@example.com"}


def test_reconciliation_result_must_be_json(approver):
    approval = unknown_step_approval()
    client, token = csrf_client(approver)
    response = client.post(
        decide_url(approval),
        {"action": "happened", "result": "{not json", "csrfmiddlewaretoken": token},
        **HX,
    )
    assert "not valid JSON" in response.content.decode()
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


def test_filters_by_kind_agent_and_age(client, approver):
    fresh = bulk_pending(2)
    old = bulk_pending(1, age=timedelta(days=2))
    recon = bulk_pending(1, kind=ApprovalKind.RECONCILIATION)
    login(client, approver)

    def shown(query: str) -> set[int]:
        html = client.get(INBOX + query).content.decode()
        return {int(x) for x in re.findall(r'id="approval-(\d+)"', html)}

    assert shown("") == {a.id for a in fresh + old + recon}
    assert shown("?kind=reconciliation") == {recon[0].id}
    assert shown("?kind=approval&age=gt24h") == {old[0].id}
    assert shown("?age=lt1h") == {a.id for a in fresh + recon}
    assert shown("?agent=script") == set()
    assert shown("?agent=ap-script&age=nonsense") == {a.id for a in fresh + old + recon}


def test_keyset_pagination_walks_every_item_once_newest_first(client, approver):
    items = bulk_pending(60)
    login(client, approver)
    seen: list[int] = []
    url = INBOX
    while url:
        html = client.get(url).content.decode()
        seen += [int(x) for x in re.findall(r'id="approval-(\d+)"', html)]
        older = re.search(r'href="\?(older=[^"]+)" rel="next"', html)
        url = INBOX + "?" + older.group(1) if older else None
    expected = [a.id for a in sorted(items, key=lambda a: (a.created_at, a.id), reverse=True)]
    assert seen == expected
    # and back: "newer" from the last page lands on the page before it
    html = client.get(
        INBOX
        + "?"
        + re.search(r'href="\?(older=[^"]+)" rel="next"', client.get(INBOX).content.decode()).group(
            1
        )
    ).content.decode()
    newer = re.search(r'href="\?(newer=[^"]+)"', html).group(1)
    back = [
        int(x)
        for x in re.findall(
            r'id="approval-(\d+)"',
            client.get(INBOX + "?" + newer.replace("&amp;", "&")).content.decode(),
        )
    ]
    assert back == expected[:25]


def _queries(client: Client, url: str, **extra) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **extra)
    assert response.status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    "extra, url",
    [({}, INBOX), (HX, INBOX + "?fragment=items"), ({}, INBOX + "?kind=approval&age=lt1h")],
)
def test_query_count_is_constant_per_page(client, approver, extra, url):
    login(client, approver)
    # both kinds on the page each time: a page with reconciliations also reads their attempts
    bulk_pending(9)
    bulk_pending(1, kind=ApprovalKind.RECONCILIATION)
    few = _queries(client, url, **extra)
    bulk_pending(90)
    bulk_pending(10, kind=ApprovalKind.RECONCILIATION)
    many = _queries(client, url, **extra)
    assert few == many, (few, many)
    html = client.get(url, **extra).content.decode()
    assert len(re.findall(r'<article class="card', html)) == 25


def test_query_count_with_10000_pending(client, approver):
    """The page costs the same queries with 10,000 pending as with 10 (timing is in the report)."""
    login(client, approver)
    bulk_pending(10)
    few = _queries(client, INBOX)
    bulk_pending(10_000 - 10)
    assert Approval.objects.filter(status="pending").count() == 10_000
    assert _queries(client, INBOX) == few
    html = client.get(INBOX).content.decode()
    assert re.search(r'id="pending-count">10000<', html)
    deep = re.search(r'href="\?(older=[^"]+)" rel="next"', html).group(1)
    assert _queries(client, INBOX + "?" + deep) == few
    bulk_pending(1)  # beyond the bounded count: shown as "10000+"
    assert re.search(r'id="pending-count">10000\+<', client.get(INBOX).content.decode())


def test_poll_answers_204_when_nothing_changed(client, approver):
    bulk_pending(3)
    login(client, approver)
    fragment = client.get(INBOX + "?fragment=items", **HX).content.decode()
    signature = re.search(r'id="inbox-state" data-signature="([0-9a-f]+)"', fragment).group(1)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(INBOX + f"?fragment=items&sig={signature}", **HX)
    assert response.status_code == 204 and response.content == b""
    assert not any("ROW_NUMBER" in q["sql"] for q in ctx.captured_queries)  # no card reads
    new = bulk_pending(1)
    response = client.get(INBOX + f"?fragment=items&sig={signature}", **HX)
    assert response.status_code == 200 and f'id="approval-{new[0].id}"' in response.content.decode()
