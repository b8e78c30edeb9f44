"""Bulk decisions over a mix of pending, already decided and over-limit items: one result per
id, each item its own decision, and the refund gateway's ledger (the real one, served by daphne)
holds exactly the refunds that were approved."""

from __future__ import annotations

import httpx
import pytest

from agentruns.models import RunStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import Approval, ApprovalStatus
from support.models import Order
from tests.approvals.kit import bulk_pending, unknown_step_approval
from tests.conftest import ApiClient
from tests.helpers import advance
from tests.procs import start_web


def refund_item(order_id: str) -> Approval:
    run = advance(start_run("refund", {"order_id": order_id, "message": "It arrived broken"}).run)
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.get(run=run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_bulk_approve_a_mix_and_the_ledger_matches_exactly_the_approved(
    tmp_path, seeded, settings, django_user_model
):
    web, url = start_web(tmp_path)
    try:
        settings.REFUND_GATEWAY_URL = url + "/gateway"
        settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 20_000
        approver = django_user_model.objects.get(username="approver")
        lead = django_user_model.objects.get(username="lead")
        items = {o: refund_item(o) for o in ("ORD-1003", "ORD-1004", "ORD-1005", "ORD-1008")}
        over = refund_item("ORD-1001")  # 247.11: above the approver's 200.00
        rejected = refund_item("ORD-1009")
        services.approve(items["ORD-1003"].id, user=lead)  # decided before the bulk
        services.reject(rejected.id, user=lead, reason="fraud check")
        ids = [a.id for a in items.values()] + [over.id, rejected.id, 999_999]

        response = ApiClient(approver).post(
            "/api/approvals/bulk", {"ids": ids, "decision": "approve", "reason": "outage batch"}
        )
        assert response.status_code == 200, response.content
        results = response.json()["results"]
        assert [r["id"] for r in results] == ids
        by_id = {r["id"]: r for r in results}
        for order in ("ORD-1004", "ORD-1005", "ORD-1008"):
            assert by_id[items[order].id] == {
                "id": items[order].id,
                "ok": True,
                "status": "approved",
                "result": "approved",
            }
        first = by_id[items["ORD-1003"].id]
        assert (first["ok"], first["code"], first["decided_by"]) == (
            False,
            "already_decided",
            "lead",
        )
        assert by_id[rejected.id]["code"] == "already_decided"
        assert by_id[rejected.id]["status"] == "rejected"
        assert by_id[over.id]["code"] == "above_limit" and "limit" in by_id[over.id]["error"]
        assert by_id[999_999]["code"] == "not_found"
        assert response.json()["summary"] == {
            "approved": 3,
            "rejected": 0,
            "recorded": 0,
            "failed": 4,
        }
        assert Approval.objects.get(id=over.id).status == ApprovalStatus.PENDING
        assert Approval.objects.get(id=items["ORD-1004"].id).reason == "outage batch"

        for approval in [*items.values(), over, rejected]:
            advance(approval.run)  # the worker's part, in this process
        ledger = httpx.get(url + "/gateway/refunds", timeout=10).json()["refunds"]
        approved = {o: Order.objects.get(order_id=o).amount_cents for o in items}
        assert sorted((r["order_id"], r["amount_cents"]) for r in ledger) == sorted(
            approved.items()
        )
        for order, approval in items.items():
            (refund,) = [r for r in ledger if r["order_id"] == order]
            assert refund["idempotency_key"] == approval.step.idempotency_key
    finally:
        web.stop()


@pytest.mark.django_db
def test_bulk_refuses_what_it_cannot_do(approver, viewer):
    pending = bulk_pending(2)
    item = unknown_step_approval()
    api = ApiClient(approver)
    rejected = api.post(
        "/api/approvals/bulk",
        {"ids": [pending[0].id, item.id], "decision": "reject", "reason": "no"},
    ).json()["results"]
    assert rejected[0]["result"] == "rejected" and rejected[1]["code"] == "wrong_kind"
    assert Approval.objects.get(id=item.id).status == ApprovalStatus.PENDING
    for body, message in (
        ({"ids": [], "decision": "approve"}, "ids"),
        ({"ids": [pending[1].id], "decision": "approve", "args": {}}, "args"),  # no edits
        ({"ids": ["1"], "decision": "approve"}, "integer"),
        ({"ids": list(range(1, 202)), "decision": "approve"}, "ids"),
        ({"ids": [pending[1].id], "decision": "maybe"}, "decision"),
    ):
        response = api.post("/api/approvals/bulk", body)
        assert response.status_code == 400 and message in response.json()["error"], body
    assert (
        ApiClient(viewer)
        .post("/api/approvals/bulk", {"ids": [pending[1].id], "decision": "approve"})
        .status_code
        == 403
    )
    assert Approval.objects.get(id=pending[1].id).status == ApprovalStatus.PENDING


@pytest.mark.django_db
def test_bulk_in_the_inbox_skips_items_others_hold_unless_confirmed(client, approver, lead):
    from approvals.domain import claims
    from tests.approvals.kit import login

    a, b = bulk_pending(2)
    claims.claim(b.id, user=lead)
    login(client, approver)
    hx = {"HTTP_HX_REQUEST": "true"}
    response = client.post(
        "/approvals/bulk/",
        {"ids": [f"{a.id}.1", f"{b.id}.1"], "action": "approve", "reason": "ok"},
        **hx,
    )
    html = response.content.decode()
    assert response.status_code == 200 and "lead is on this item" in html
    assert Approval.objects.get(id=a.id).status == ApprovalStatus.APPROVED
    assert Approval.objects.get(id=b.id).status == ApprovalStatus.PENDING
    missing_reason = client.post("/approvals/bulk/", {"ids": [b.id], "action": "reject"}, **hx)
    assert "Give a reason" in missing_reason.content.decode()
    client.post(
        "/approvals/bulk/",
        {"ids": [f"{b.id}.1"], "action": "reject", "reason": "dupe", "override_claim": "1"},
        **hx,
    )
    assert Approval.objects.get(id=b.id).status == ApprovalStatus.REJECTED
