"""The two-person rule (DESIGN.md 4.6, 6): refunds above REFUND_TWO_PERSON_CENTS need two
approvers, neither of them the run's starter; one decision row per approver; the same person
twice is refused; a rejection by anyone ends it; an edit starts the count again from the editor.
With a real worker and gateway: a real two-thread race on the last approval gives one
"approved", and the ledger shows no refund after the first approval and one after the second.
"""

from __future__ import annotations

import httpx
import pytest
from django.core.cache import caches
from django.core.cache.utils import make_template_fragment_key

from agentruns.models import Run, RunEvent, RunStatus, Step, StepStatus
from agentruns.services import start_run
from agentruns.tokens import create_token
from approvals import errors, services
from approvals.models import Approval, ApprovalDecision, ApprovalStatus
from support.models import GatewayRefund
from tests.conftest import ApiClient, make_user
from tests.helpers import advance, race
from tests.procs import start_web, start_worker, wait_until

TWO_PERSON = 10_000  # 100.00: ORD-1001 (247.11) needs two approvers, ORD-1013 (57.36) one


@pytest.fixture
def staff(seeded, settings, django_user_model) -> dict:
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    settings.REFUND_TWO_PERSON_CENTS = TWO_PERSON
    users = {u.username: u for u in django_user_model.objects.all()}
    users["clerk"] = make_user(
        django_user_model, "clerk", ["agentruns.start_run", "agentruns.view_run"]
    )
    return users


def parked(order_id: str, starter) -> Approval:
    run = advance(
        start_run("refund", {"order_id": order_id, "message": "broken"}, user=starter).run
    )
    assert run.status == RunStatus.WAITING, run.error
    return Approval.objects.select_related("run", "step").get(run=run)


def decide(user, approval: Approval, **body):
    return ApiClient(user).post(f"/api/approvals/{approval.id}", {"decision": "approve", **body})


@pytest.mark.django_db
def test_two_distinct_approvers_neither_the_starter(staff):
    approval = parked("ORD-1001", staff["approver2"])
    assert approval.approvals_required == 2

    starter = decide(staff["approver2"], approval)
    assert starter.status_code == 403 and "you started this run" in starter.json()["error"]

    first = decide(staff["approver"], approval, reason="looks right")
    assert first.status_code == 200
    body = first.json()
    assert body["status"] == "pending"  # still waiting for the second person
    assert body["approvals_required"] == 2 and body["approvals_given"] == 1
    assert [(d["by"], d["counted"]) for d in body["decisions"]] == [("approver", True)]
    assert Run.objects.get(id=approval.run_id).status == RunStatus.WAITING
    assert Step.objects.get(id=approval.step_id).status == StepStatus.WAITING_APPROVAL

    again = decide(staff["approver"], approval)
    assert again.status_code == 409 and "already approved this" in again.json()["error"]
    assert again.json()["approval"]["approvals_given"] == 1

    listed = ApiClient(staff["viewer"]).get("/api/approvals?status=pending").json()["approvals"]
    assert [(a["id"], a["approvals_required"], a["approvals_given"]) for a in listed] == [
        (approval.id, 2, 1)
    ]

    second = decide(staff["lead"], approval)
    assert second.status_code == 200 and second.json()["status"] == "approved"
    assert second.json()["approvals_given"] == 2
    rows = ApprovalDecision.objects.filter(approval=approval).order_by("decided_at")
    assert [(r.username, r.decision, r.round) for r in rows] == [
        ("approver", "approve", 1),
        ("lead", "approve", 1),
    ]
    assert Run.objects.get(id=approval.run_id).status == RunStatus.QUEUED
    given = RunEvent.objects.get(run_id=approval.run_id, type="approval.given")
    assert given.data["by"] == "approver" and (given.data["given"], given.data["required"]) == (
        1,
        2,
    )
    decided = RunEvent.objects.get(run_id=approval.run_id, type="approval.decided")
    assert [a["by"] for a in decided.data["approvals"]] == ["approver", "lead"]
    assert decided.data["by"] == "lead"


@pytest.mark.django_db
def test_an_edit_by_the_second_approver_starts_the_count_again(staff):
    approval = parked("ORD-1001", staff["clerk"])
    requested = approval.requested_args["amount_cents"]
    assert decide(staff["approver"], approval).json()["approvals_given"] == 1
    edited = decide(staff["lead"], approval, args={"amount_cents": 20_000}).json()
    # the first approval was for other arguments: the edited call needs two approvals again,
    # and the editor's is the first of them
    assert edited["status"] == "pending" and edited["round"] == 2
    assert edited["approvals_given"] == 1 and edited["args"]["amount_cents"] == 20_000
    assert [(d["by"], d["round"], d["counted"]) for d in edited["decisions"]] == [
        ("approver", 1, False),
        ("lead", 2, True),
    ]
    assert decide(staff["lead"], approval, version=edited["version"]).status_code == 409
    # after an edit a decision must name the version it was made on: without one, a 409
    unnamed = decide(staff["approver"], approval)
    assert unnamed.status_code == 409 and unnamed.json()["approval"]["version"] == 3
    # the first approver approves the edit
    done = decide(staff["approver"], approval, version=edited["version"]).json()
    assert done["status"] == "approved" and done["edited_args"]["amount_cents"] == 20_000
    assert done["requested_args"]["amount_cents"] == requested
    assert Step.objects.get(id=approval.step_id).arguments["amount_cents"] == 20_000


@pytest.mark.django_db
def test_a_rejection_by_any_approver_ends_it(staff):
    approval = parked("ORD-1001", staff["clerk"])
    decide(staff["approver"], approval)
    response = ApiClient(staff["approver2"]).post(
        f"/api/approvals/{approval.id}", {"decision": "reject", "reason": "duplicate claim"}
    )
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert Step.objects.get(id=approval.step_id).status == StepStatus.REJECTED
    assert decide(staff["lead"], approval).status_code == 409
    rows = ApprovalDecision.objects.filter(approval=approval).order_by("decided_at")
    assert [(r.username, r.decision) for r in rows] == [
        ("approver", "approve"),
        ("approver2", "reject"),
    ]


@pytest.mark.django_db
def test_the_starter_may_approve_a_call_that_needs_one_approver(staff):
    approval = parked("ORD-1013", staff["approver2"])  # 57.36: below the two-person amount
    assert approval.approvals_required == 1
    response = decide(staff["approver2"], approval)
    assert response.status_code == 200 and response.json()["status"] == "approved"


@pytest.mark.django_db
def test_the_inbox_shows_who_approved_and_who_may_still_decide(staff, client):
    approval = parked("ORD-1001", staff["approver2"])
    decide(staff["approver"], approval)
    client.force_login(staff["lead"])
    html = client.get("/approvals/").content.decode()
    assert '1 of 2</strong>: approved by <strong class="approver">approver</strong> <time' in html
    assert (
        "Still needed: 1 more approval from anyone who may decide, except approver2 (started "
        "the run), approver (approved)." in html
    )
    assert 'value="approve"' in item_card(html, approval.id)  # the lead may give the 2nd approval
    for who in ("approver", "approver2"):  # the approver and the starter may only reject
        client.force_login(staff[who])
        card = item_card(client.get("/approvals/").content.decode(), approval.id)
        assert 'value="approve"' not in card and 'value="reject"' in card
        assert "you-may-not" in card


@pytest.mark.django_db
def test_the_inbox_keeps_its_card_fragments_in_their_own_cache(staff, client):
    """The cards' fragments go to the `template_fragments` cache (config/settings.py), not the
    default one, whose 300 entries a page's ~150 fragments would churn."""
    approval = parked("ORD-1001", staff["clerk"])
    client.force_login(staff["approver2"])
    assert client.get("/approvals/").status_code == 200
    key = make_template_fragment_key("approval-notes", [approval.id])
    assert caches["template_fragments"].get(key) is not None
    assert caches["default"].get(key) is None


@pytest.mark.django_db
def test_the_inbox_shows_an_edit_made_after_it_showed_the_card(staff, client):
    """A card's edit form, call and head are cached by what they show: an edit shows at once."""
    approval = parked("ORD-1001", staff["clerk"])
    client.force_login(staff["approver2"])
    before = item_card(client.get("/approvals/").content.decode(), approval.id)
    assert 'data-original="247.11"' in before and "<code>24711</code>" in before
    assert '<strong class="amount" data-cents="24711">247.11 USD</strong>' in before
    edited = decide(staff["lead"], approval, args={"amount_cents": 20_000}).json()
    assert edited["status"] == "pending"
    after = item_card(client.get("/approvals/").content.decode(), approval.id)
    assert 'data-original="200.00"' in after and 'data-original="247.11"' not in after
    # the card's head too (the amount it asks for now)
    assert '<strong class="amount" data-cents="20000">200.00 USD</strong>' in after
    assert "<code>20000</code>" in after and "<code>24711</code>" not in after


def item_card(html: str, approval_id: int) -> str:
    """The item's own card (the page also has the bulk bar's approve button)."""
    start = html.index(f'id="approval-{approval_id}"')
    return html[start : html.index("</article>", start)]


def _race(users, approval_id: int) -> list[str]:
    """Each user approves in their own thread (own database connection), released together."""

    def approve(user) -> str:
        try:
            return f"{user.username}: {services.approve(approval_id, user=user).status}"
        except errors.AlreadyDecided:
            return f"{user.username}: already decided"

    return sorted(race(*[lambda u=u: approve(u) for u in users]))


@pytest.mark.django_db(transaction=True)
def test_two_approvers_at_once_on_the_first_approval_both_count(staff):
    """Both approvals of a fresh item at the same moment: serialised on the item's lock, so
    neither is lost (without it both would read "0 given" and write "1 given")."""
    approval = parked("ORD-1001", staff["clerk"])
    outcomes = _race([staff["approver"], staff["approver2"]], approval.id)
    assert sorted(o.split(": ")[1] for o in outcomes) == ["approved", "pending"], outcomes
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.approvals_given == 2
    assert ApprovalDecision.objects.filter(approval=approval).count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_race_on_the_last_approval_and_the_ledger_on_a_real_worker(staff, tmp_path):
    web, url = start_web(tmp_path)
    worker = start_worker(
        tmp_path,
        REFUND_GATEWAY_URL=url + "/gateway",
        REFUND_APPROVAL_THRESHOLD_CENTS=0,
        REFUND_TWO_PERSON_CENTS=TWO_PERSON,
    )
    try:

        def api(user) -> httpx.Client:
            token = create_token(user)
            return httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            )

        created = api(staff["clerk"]).post(
            "/api/runs", json={"agent": "refund", "input": {"order_id": "ORD-1001"}}
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        approval = wait_until(
            lambda: Approval.objects.filter(run_id=run_id, status="pending").first(),
            timeout=120,
            message="the refund to park",
        )
        assert approval.approvals_required == 2

        def ledger() -> list[dict]:
            return (
                api(staff["viewer"])
                .get("/gateway/refunds", params={"order_id": "ORD-1001"})
                .json()["refunds"]
            )

        refused = api(staff["clerk"]).post(
            f"/api/approvals/{approval.id}", json={"decision": "approve"}
        )
        assert refused.status_code == 403  # the clerk may not decide at all
        first = api(staff["approver2"]).post(
            f"/api/approvals/{approval.id}", json={"decision": "approve"}
        )
        assert first.status_code == 200 and first.json()["status"] == "pending"
        # after the first approval the run stays parked: the call has not run, nothing refunded
        assert Run.objects.get(id=run_id).status == RunStatus.WAITING
        assert Step.objects.get(id=approval.step_id).status == StepStatus.WAITING_APPROVAL
        assert ledger() == []

        outcomes = _race([staff["approver"], staff["lead"]], approval.id)
        statuses = sorted(o.split(": ")[1] for o in outcomes)
        assert statuses == ["already decided", "approved"], outcomes
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.APPROVED and approval.approvals_given == 2
        assert ApprovalDecision.objects.filter(approval=approval).count() == 2

        def done():
            fresh = Run.objects.get(id=run_id)
            return fresh if fresh.is_terminal else None

        finished = wait_until(done, timeout=120, message="the run to finish")
        assert finished.status == RunStatus.SUCCEEDED, finished.error
        refunds = ledger()
        assert len(refunds) == 1 and GatewayRefund.objects.filter(order_id="ORD-1001").count() == 1
        assert (
            refunds[0]["idempotency_key"] == Step.objects.get(id=approval.step_id).idempotency_key
        )
    finally:
        worker.stop()
        web.stop()
