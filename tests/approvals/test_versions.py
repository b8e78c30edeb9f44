"""A decision applies to what the approver saw (issue 24): versioned proposals in every door,
the executed call checked against the approved digest, the real decider named to a loser, and
deciding or claiming only for who may see the item. The two-person case with a real worker and
the gateway's ledger: tests/approvals/test_versions_worker.py."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from agentruns.models import RunStatus, Step, StepStatus
from approvals import errors, services
from approvals.api.approvals import already_decided
from approvals.models import Approval, ApprovalStatus
from tests.conftest import make_user
from tests.helpers import ApiClient, advance, race

from .kit import CALLS, SECRET, login, parked_approval


@pytest.fixture
def two_person(monkeypatch):
    """ap_refund needs two approvers (as the demo's refund above REFUND_TWO_PERSON_CENTS)."""
    from agentruns.registry import get_tool

    monkeypatch.setattr(get_tool("ap_refund"), "approvals_required", 2)


@pytest.fixture
def approver2(db, django_user_model):
    return make_user(
        django_user_model,
        "approver2",
        ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
    )


def post(user, approval: Approval, **body):
    return ApiClient(user).post(f"/api/approvals/{approval.id}", {"decision": "approve", **body})


@pytest.mark.django_db
def test_an_approval_on_an_older_version_is_a_409_with_the_current_proposal(
    approver, approver2, lead, two_person
):
    approval = parked_approval(amount=4599)
    listed = ApiClient(lead).get("/api/approvals?status=pending").json()["approvals"]
    seen = listed[0]["version"]  # what lead's screen shows: 45.99
    assert seen == 1
    edit = post(approver2, approval, args={"amount_cents": 100, "reason": "only the lid"})
    assert edit.status_code == 200 and edit.json()["version"] == 2
    stale = post(lead, approval, version=seen)
    assert stale.status_code == 409, stale.content
    body = stale.json()
    assert "the proposal changed since you saw it" in body["error"]
    assert body["approval"]["version"] == 2 and body["approval"]["args"]["amount_cents"] == 100
    assert body["approval"]["approvals_given"] == 1  # lead's stale approval was not counted
    # without a version, after an edit: refused as well (the API allows none only unedited)
    assert post(lead, approval).status_code == 409
    stale_reject = ApiClient(lead).post(
        f"/api/approvals/{approval.id}", {"decision": "reject", "reason": "x", "version": 1}
    )
    assert stale_reject.status_code == 409
    current = post(lead, approval, version=2)
    assert current.status_code == 200 and current.json()["status"] == "approved"
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == 100


@pytest.mark.django_db
def test_bulk_carries_versions_in_the_api_and_the_inbox(approver, approver2, lead, two_person):
    via_api, via_inbox = parked_approval(), parked_approval()
    for approval in (via_api, via_inbox):
        assert post(approver2, approval, args={"amount_cents": 100}).status_code == 200
    api = ApiClient(lead)
    stale = api.post(
        "/api/approvals/bulk",
        {"ids": [via_api.id], "decision": "approve", "versions": {str(via_api.id): 1}},
    ).json()["results"]
    assert stale == [
        {
            "id": via_api.id,
            "ok": False,
            "code": "stale_version",
            "error": stale[0]["error"],
            "version": 2,
        }
    ]
    unnamed = api.post("/api/approvals/bulk", {"ids": [via_api.id], "decision": "approve"})
    assert unnamed.json()["results"][0]["code"] == "stale_version"  # edited: a version is needed
    bad_key = api.post(
        "/api/approvals/bulk", {"ids": [via_api.id], "decision": "approve", "versions": {"²": 1}}
    )
    assert bad_key.status_code == 400
    # the inbox's bulk form: a selection is "<id>.<version>" as the card showed it
    client = login(Client(), lead)
    hx = {"HTTP_HX_REQUEST": "true"}
    html = client.get("/approvals/").content.decode()
    assert f'value="{via_inbox.id}.2"' in html
    response = client.post(
        "/approvals/bulk/", {"ids": [f"{via_inbox.id}.1"], "action": "approve"}, **hx
    )
    assert "the proposal changed since you saw it" in response.content.decode()
    for approval in (via_api, via_inbox):
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.PENDING and approval.approvals_given == 1
    client.post("/approvals/bulk/", {"ids": [f"{via_inbox.id}.2"], "action": "approve"}, **hx)
    ok = api.post(
        "/api/approvals/bulk",
        {"ids": [via_api.id], "decision": "approve", "versions": {str(via_api.id): 2}},
    ).json()["results"][0]
    assert ok["ok"] and ok["result"] == "approved"
    assert Approval.objects.get(id=via_inbox.id).status == ApprovalStatus.APPROVED


@pytest.mark.django_db
def test_the_inbox_card_carries_its_version_and_a_stale_form_changes_nothing(
    approver, approver2, lead, two_person
):
    approval = parked_approval()
    client = login(Client(), lead)
    card = client.get("/approvals/").content.decode()
    assert 'name="version" value="1"' in card
    assert post(approver2, approval, args={"amount_cents": 100}).status_code == 200
    hx = {"HTTP_HX_REQUEST": "true"}
    for form in ({"action": "approve", "version": "1"}, {"action": "approve"}):
        response = client.post(f"/approvals/{approval.id}/decide/", form, **hx)
        assert response["X-Decision-Status"] == "409"
        html = response.content.decode()
        assert "the proposal changed since you saw it" in html
        assert 'name="version" value="2"' in html  # the card now shows the current proposal
    approval.refresh_from_db()
    assert approval.approvals_given == 1 and approval.status == ApprovalStatus.PENDING


@pytest.mark.django_db
def test_the_executed_call_is_checked_against_the_approved_digest(approver):
    approval = parked_approval(amount=4599)
    services.approve(approval.id, user=approver, edited_args={"amount_cents": 1000})
    # anything that changes the arguments after the approval (a bug, a hand in the database)
    Step.objects.filter(id=approval.step_id).update(
        arguments={**approval.requested_args, "amount_cents": 4599}
    )
    run = advance(approval.run)
    assert CALLS["ap_refund"] == []  # never executed
    step = Step.objects.get(id=approval.step_id)
    assert step.status == StepStatus.REJECTED and "differ from the ones approved" in step.error
    assert run.status == RunStatus.SUCCEEDED  # the model heard the refusal and finished


@pytest.mark.django_db
def test_the_approved_call_runs_with_the_approved_arguments(approver):
    approval = parked_approval(amount=4599)
    services.approve(approval.id, user=approver, edited_args={"amount_cents": 1000})
    advance(approval.run)
    assert [args["amount_cents"] for _, args in CALLS["ap_refund"]] == [1000]
    assert CALLS["ap_refund"][0][1]["card_token"] == SECRET


@pytest.mark.django_db(transaction=True)
def test_racing_losers_are_told_the_real_decider(django_user_model):
    """Several approvers on the last approval at once: every loser's 409 names who won (the
    row is read after its lock, not in the locking statement, whose join was stale)."""
    perms = ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"]
    users = [make_user(django_user_model, f"racer{n}", perms) for n in range(4)]
    for _ in range(3):
        approval = parked_approval()

        def approve(user, approval_id=approval.id):
            try:
                return services.approve(approval_id, user=user).decided_by.username
            except errors.AlreadyDecided as exc:
                return ("lost", exc.who, already_decided(exc).extra["decided_by"])

        outcomes = race(*[lambda u=u: approve(u) for u in users])
        winners = [o for o in outcomes if isinstance(o, str)]
        assert len(winners) == 1, outcomes
        losers = [o for o in outcomes if isinstance(o, tuple)]
        assert losers and all(who == winners[0] for _, who, _ in losers), outcomes
        assert all(decided_by == winners[0] for _, _, decided_by in losers), outcomes


@pytest.mark.django_db
def test_deciding_or_claiming_needs_view_approval(django_user_model):
    approval, other = parked_approval(), parked_approval()
    blind = make_user(django_user_model, "blind", ["agentruns.view_run"])
    blind.user_permissions.add(Permission.objects.get(codename="decide_approval"))
    api = ApiClient(blind)
    claim = api.post(f"/api/approvals/{approval.id}/claim")
    assert claim.status_code == 403 and "view_approval" in claim.json()["error"]
    assert "args" not in claim.json() and "ORD-1001" not in claim.content.decode()
    decide = api.post(f"/api/approvals/{approval.id}", {"decision": "reject", "reason": "x"})
    assert decide.status_code == 403
    bulk = api.post("/api/approvals/bulk", {"ids": [approval.id, other.id], "decision": "reject"})
    assert bulk.status_code == 403
    client = login(Client(), blind)
    hx = {"HTTP_HX_REQUEST": "true"}
    inbox_bulk = client.post(
        "/approvals/bulk/",
        {"ids": [f"{approval.id}.1"], "action": "reject", "reason": "enumerated"},
        **hx,
    )
    assert inbox_bulk.status_code == 403
    assert client.post(f"/approvals/{approval.id}/claim/", **hx).status_code == 403
    for item in (approval, other):
        item.refresh_from_db()
        assert item.status == ApprovalStatus.PENDING and item.claimed_by is None


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["²", "١٤", "14x", "-1", "1.2.3", "9" * 19])
def test_the_inbox_bulk_form_refuses_ids_that_are_not_ascii_digits(approver, raw):
    approval = parked_approval()
    client = login(Client(), approver)
    response = client.post(
        "/approvals/bulk/",
        {"ids": [raw, f"{approval.id}.1"], "action": "approve"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 400 and "not an id" in response.content.decode()
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


@pytest.mark.parametrize(
    "raw, parsed",
    [("14", (14, None)), ("14.3", (14, 3)), ("²", None), ("١٤", None), ("14.", None), ("", None)],
)
def test_one_parser_for_ids_ascii_digits_only(raw, parsed):
    from agentruns.runtime.values.ids import BadId, parse_versioned_id
    from agentruns.selectors.pagination import decode_cursor

    if parsed is None:
        with pytest.raises(BadId):
            parse_versioned_id(raw)
        assert decode_cursor(f"1000-{raw}") is None and decode_cursor(f"{raw}-1") is None
    else:
        assert parse_versioned_id(raw) == parsed
