"""Two promises of README "Who may do what" no other test holds: the highest approver limit of a
user's groups applies, and a field the tool redacts is never editable (the masked value an
approver saw passes and leaves the requested value; any other value is refused, nothing changes).
"""

from __future__ import annotations

import pytest

from agentruns.services import start_run
from approvals import services
from approvals.domain import policy
from approvals.models import Approval, ApprovalStatus
from tests.approvals.kit import SECRET, parked_approval
from tests.conftest import ApiClient
from tests.helpers import advance, make_user
from tests.runtime.test_tool_policy import member, policy_for

pytestmark = pytest.mark.django_db


def test_the_highest_limit_of_a_users_groups_applies(seeded, settings, django_user_model):
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 1000
    policy_for("approver", {"issue_refund": {"approver_limit": 3000}}, others=True)
    policy_for("seniors", {"issue_refund": {"approver_limit": 100_000}}, others=True)
    both = member(
        django_user_model, "both", "approver", "seniors", perms=("approvals.decide_approval",)
    )
    run = advance(start_run("refund", {"order_id": "ORD-1004", "message": "broken"}).run)
    approval = Approval.objects.select_related("run").get(run=run)
    assert 3000 < approval.requested_args["amount_cents"] <= 100_000
    assert policy.approver_limit(approval, both) == 100_000
    services.approve(approval.id, user=both)
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.APPROVED


def test_a_redacted_field_is_never_editable(django_user_model):
    approver = make_user(
        django_user_model, "approver-r", ["approvals.decide_approval", "approvals.view_approval"]
    )
    approval = parked_approval()
    assert approval.requested_args["card_token"] == SECRET
    api = ApiClient(approver)
    refused = api.post(
        f"/api/approvals/{approval.id}",
        {"decision": "approve", "args": {"card_token": "tok_attacker"}},
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["field"] == "card_token"
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and not approval.edited_args
    # the masked value the approver was shown is no edit: approved with the requested token
    shown = api.get("/api/approvals?status=pending").json()["approvals"][0]["args"]
    assert shown["card_token"] != SECRET
    ok = api.post(f"/api/approvals/{approval.id}", {"decision": "approve", "args": shown})
    assert ok.status_code == 200, ok.content
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.effective_args["card_token"] == SECRET
