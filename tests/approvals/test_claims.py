"""Claims ("I'm on it") from the API and the inbox: 409 with who and since when, lapsing,
one winner of a race, and "taken by X" with a confirmation before deciding it anyway."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from approvals import errors
from approvals.domain import claims
from approvals.models import Approval, ApprovalStatus
from tests.approvals.kit import login, parked_approval
from tests.conftest import ApiClient, make_user
from tests.helpers import race

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def second(django_user_model):
    return make_user(
        django_user_model,
        "second",
        ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
    )


def test_claim_and_release_over_the_api(approver, second, viewer):
    approval = parked_approval()
    mine, theirs = ApiClient(approver), ApiClient(second)
    response = mine.post(f"/api/approvals/{approval.id}/claim")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["claimed_by"] == "approver" and body["claimed_at"] and body["claim_expires_at"]
    listed = mine.get("/api/approvals?status=pending").json()["approvals"][0]
    assert listed["claimed_by"] == "approver"
    refused = theirs.post(f"/api/approvals/{approval.id}/claim")
    assert refused.status_code == 409
    assert refused.json()["claimed_by"] == "approver"
    assert refused.json()["claimed_at"] == body["claimed_at"]
    assert "approver is on this item since" in refused.json()["error"]
    assert theirs.post(f"/api/approvals/{approval.id}/release").status_code == 409
    assert mine.post(f"/api/approvals/{approval.id}/claim").status_code == 200  # renews
    released = mine.post(f"/api/approvals/{approval.id}/release")
    assert released.status_code == 200 and released.json()["claimed_by"] is None
    assert theirs.post(f"/api/approvals/{approval.id}/claim").json()["claimed_by"] == "second"
    assert ApiClient(viewer).post(f"/api/approvals/{approval.id}/claim").status_code == 403
    assert mine.post("/api/approvals/999999/claim").status_code == 404


def test_a_claim_lapses_and_a_decided_item_cannot_be_claimed(approver, second, settings):
    settings.AGENTRUNS_CLAIM_SECONDS = 60
    approval = parked_approval()
    claims.claim(approval.id, user=approver)
    Approval.objects.filter(id=approval.id).update(
        claimed_at=approval.created_at - timedelta(seconds=61)
    )
    assert Approval.objects.get(id=approval.id).claimant() is None  # nobody holds it any more
    assert claims.claim(approval.id, user=second).claimed_by == second
    ApiClient(second).post(f"/api/approvals/{approval.id}", {"decision": "approve"})
    response = ApiClient(approver).post(f"/api/approvals/{approval.id}/claim")
    assert response.status_code == 409 and response.json()["status"] == "approved"
    assert (
        ApiClient(approver)
        .get("/api/approvals?status=approved")
        .json()["approvals"][0]["claimed_by"]
        is None
    )


@pytest.mark.django_db(transaction=True)
def test_two_people_claim_at_once_and_exactly_one_wins(approver, second):
    approval = parked_approval()
    results = race(
        lambda: claims.claim(approval.id, user=approver),
        lambda: claims.claim(approval.id, user=second),
    )
    outcome = dict(zip([approver.username, second.username], results, strict=True))
    winners = [name for name, v in outcome.items() if isinstance(v, Approval)]
    losers = [v for v in outcome.values() if isinstance(v, errors.ClaimedByOther)]
    assert len(winners) == 1 and len(losers) == 1, outcome
    assert losers[0].holder == winners[0]
    assert Approval.objects.get(id=approval.id).claimed_by.username == winners[0]


def test_the_inbox_shows_who_holds_an_item_and_asks_before_deciding_it(approver, second):
    approval = parked_approval()
    mine = login(Client(), approver)
    response = mine.post(f"/approvals/{approval.id}/claim/", **HX)
    assert response["X-Claim-Status"] == "200" and "Release" in response.content.decode()
    theirs = login(Client(), second)
    html = theirs.get("/approvals/").content.decode()
    assert 'data-claimed-by="approver"' in html and "taken by <strong" in html
    assert (
        "I&#x27;m on it" not in html.split(f'id="approval-{approval.id}"')[1].split("</header>")[0]
    )
    refused = theirs.post(
        f"/approvals/{approval.id}/decide/",
        {"version": "1", "action": "approve", "override_claim": ""},
        **HX,
    )
    assert refused["X-Decision-Status"] == "409" and "approver is on this item" in (
        refused.content.decode()
    )
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    claimed = theirs.post(f"/approvals/{approval.id}/claim/", **HX)
    assert claimed["X-Claim-Status"] == "409"
    decided = theirs.post(
        f"/approvals/{approval.id}/decide/",
        {"version": "1", "action": "approve", "override_claim": "1"},
        **HX,
    )
    assert decided["X-Decision-Status"] == "200"
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.APPROVED


def test_the_poll_sees_a_new_claim(approver, second):
    approval = parked_approval()
    theirs = login(Client(), second)
    page = theirs.get("/approvals/").content.decode()
    sig = page.split('data-signature="')[1].split('"')[0]
    poll = f"/approvals/?fragment=items&sig={sig}"
    assert theirs.get(poll, **HX).status_code == 204
    claims.claim(approval.id, user=approver)
    changed = theirs.get(poll, **HX)
    assert changed.status_code == 200 and 'data-claimed-by="approver"' in changed.content.decode()
