"""`GET /api/approvals?status=pending` and `POST /api/approvals/<id>` (DESIGN.md 6)."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Step
from approvals.models import Approval, ApprovalStatus
from tests.helpers import ApiClient

from .kit import SECRET, parked_approval, unknown_step_approval

pytestmark = pytest.mark.django_db


def url(approval: Approval) -> str:
    return f"/api/approvals/{approval.id}"


def test_list_pending_with_the_card_summary(approver):
    approval = parked_approval()
    other = parked_approval()
    api = ApiClient(approver)
    ApiClient(approver).post(url(other), {"decision": "approve"})
    response = api.get("/api/approvals?status=pending")
    assert response.status_code == 200
    rows = response.json()["approvals"]
    assert [r["id"] for r in rows] == [approval.id]
    row = rows[0]
    assert row["status"] == "pending" and row["kind"] == "approval" and row["tool"] == "ap_refund"
    assert row["run_id"] == str(approval.run_id)
    assert (
        row["requested_args"]["card_token"] != SECRET
        and row["requested_args"]["amount_cents"] == 4599
    )
    assert row["summary"]["customer"] == "Ada Lovelace"
    assert row["summary"]["amount_cents"] == 4599 and row["summary"]["currency"] == "EUR"
    approved = api.get("/api/approvals?status=approved").json()["approvals"]
    assert [r["id"] for r in approved] == [other.id] and approved[0]["decided_by"] == "approver"


def test_list_errors_are_json(client, approver):
    assert client.get("/api/approvals?status=pending").status_code == 401
    api = ApiClient(approver)
    response = api.get("/api/approvals?status=bogus")
    assert response.status_code == 400 and "status must be" in response.json()["error"]


def test_approve_with_edited_args_then_409_for_the_second(
    approver, lead, django_capture_on_commit_callbacks
):
    approval = parked_approval()
    with django_capture_on_commit_callbacks(execute=True):
        response = ApiClient(approver).post(
            url(approval),
            {"decision": "approve", "args": {"amount_cents": 2000}, "reason": "partial"},
        )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved" and body["edited_args"]["amount_cents"] == 2000
    assert body["edited_args"]["card_token"] != SECRET
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == 2000
    assert Run.objects.get(id=approval.run_id).status == RunStatus.QUEUED
    late = ApiClient(lead).post(url(approval), {"decision": "reject", "reason": "no"})
    assert late.status_code == 409
    assert late.json()["decided_by"] == "approver" and late.json()["decided_at"]
    assert "already approved by approver" in late.json()["error"]
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.APPROVED


def test_reject_with_reason(approver):
    approval = parked_approval()
    response = ApiClient(approver).post(
        url(approval), {"decision": "reject", "reason": "fraud suspected"}
    )
    assert response.status_code == 200 and response.json()["reason"] == "fraud suspected"
    assert Step.objects.get(id=approval.step_id).result == {
        "error": "rejected",
        "reason": "fraud suspected",
    }


def test_viewer_cannot_decide_via_api(viewer):
    approval = parked_approval()
    response = ApiClient(viewer).post(url(approval), {"decision": "approve"})
    assert response.status_code == 403 and "decide_approval" in response.json()["error"]
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    assert ApiClient(viewer).get("/api/approvals?status=pending").status_code == 200  # may look


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"decision": "maybe"}, 400, "'decision' must be"),
        ({"decision": "approve", "args": [1]}, 400, "'args' must be a JSON object"),
        ({"decision": "approve", "args": {"amount_cents": -5}}, 400, "amount_cents"),
        ({"decision": "reject", "reason": 7}, 400, "'reason' must be a string"),
        ({"decision": "happened"}, 422, "not a reconciliation"),
    ],
)
def test_bad_decisions_are_json_errors(approver, body, status, message):
    approval = parked_approval()
    response = ApiClient(approver).post(url(approval), body)
    assert response.status_code == status and message in response.json()["error"]
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING


def test_unknown_or_malformed_ids_are_404(approver):
    api = ApiClient(approver)
    for path in (
        "/api/approvals/999999",
        "/api/approvals/abc",
        "/api/approvals/99999999999999999999999",
    ):
        response = api.post(path, {"decision": "approve"})
        assert response.status_code == 404 and response.json()["error"]
    assert api.post("/api/approvals/1", raw="{nope").status_code in (400, 404)


def test_approver_limit_via_api(approver, settings):
    settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 3000
    approval = parked_approval(amount=4599)
    response = ApiClient(approver).post(url(approval), {"decision": "approve"})
    assert response.status_code == 403 and "above your approval limit" in response.json()["error"]
    response = ApiClient(approver).post(
        url(approval), {"decision": "approve", "args": {"amount_cents": 2999}}
    )
    assert response.status_code == 200


@pytest.mark.parametrize("decision", ["happened", "retry", "abort"])
def test_reconciliation_via_api(approver, decision):
    approval = unknown_step_approval()
    response = ApiClient(approver).post(
        url(approval),
        {"decision": decision, "result": {"sent": "checked"} if decision == "happened" else None},
    )
    assert response.status_code == 200 and response.json()["resolution"] == decision
    expected = RunStatus.FAILED if decision == "abort" else RunStatus.QUEUED
    assert Run.objects.get(id=approval.run_id).status == expected
