"""Decision services on PostgreSQL: approve, edit, reject, expire, reconcile, and a real race."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import Run, RunEvent, RunStatus, Step, StepStatus
from agentruns.runtime.workers.sweeper import sweep
from agentruns.services import cancel_run, start_run
from approvals import errors, services
from approvals.domain import outcomes
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from tests.helpers import ApiClient, advance, assert_gapless, event_types, events, race

from .kit import (
    CALLS,
    CRASH_NEXT,
    SECRET,
    die_mid_call_then_recover,
    parked_approval,
    unknown_step_approval,
)

pytestmark = pytest.mark.django_db


def queued_tasks_for(run_id) -> int:
    """django-q2 ORM broker rows that would advance this run (the worker's doorbell)."""
    return sum(1 for row in OrmQ.objects.all() if row.task.get("args") == (str(run_id),))


def test_approve_resumes_the_run_with_the_requested_args(
    approver, django_capture_on_commit_callbacks
):
    approval = parked_approval()
    before = queued_tasks_for(approval.run_id)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(approval.id, user=approver)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decided_by == approver and approval.decided_at is not None
    assert approval.edited_args is None
    run = Run.objects.get(id=approval.run_id)
    assert run.status == RunStatus.QUEUED
    assert queued_tasks_for(run.id) == before + 1
    (event,) = events(run.id, "approval.decided")
    assert event.data["decision"] == "approved" and event.data["by"] == "approver"
    assert event.data["at"] and event.data["diff"] == {} and event.data["edited"] is False
    # the timeline never shows the secret argument
    assert (
        event.data["requested"]["card_token"] != SECRET
        and event.data["approved"]["card_token"] != SECRET
    )
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED
    step = Step.objects.get(id=approval.step_id)
    assert CALLS["ap_refund"] == [
        (step.idempotency_key, {"order_id": "ORD-1001", "amount_cents": 4599, "card_token": SECRET})
    ]
    assert_gapless(run.id)


def test_approve_with_edited_args_validates_stores_and_audits_the_diff(
    approver, django_capture_on_commit_callbacks
):
    approval = parked_approval(amount=4599)
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(
            approval.id,
            user=approver,
            edited_args={"amount_cents": 2500},
            reason="partial: only the lid",
        )
    approval.refresh_from_db()
    assert approval.requested_args["amount_cents"] == 4599
    assert approval.edited_args == {
        "order_id": "ORD-1001",
        "amount_cents": 2500,
        "reason": "The blender arrived broken",
        "card_token": SECRET,
    }
    (event,) = events(approval.run_id, "approval.decided")
    assert event.data["diff"] == {"amount_cents": {"from": 4599, "to": 2500}}
    assert event.data["reason"] == "partial: only the lid"
    run = advance(Run.objects.get(id=approval.run_id))
    assert run.status == RunStatus.SUCCEEDED
    assert [c[1]["amount_cents"] for c in CALLS["ap_refund"]] == [2500]


@pytest.mark.parametrize(
    "edited, message",
    [
        ({"amount_cents": "lots"}, "amount_cents"),
        ({"amount_cents": 0}, "amount_cents"),
        ({"order_id": "not-an-order"}, "order_id"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_edits_change_nothing(approver, edited, message):
    approval = parked_approval()
    events_before = RunEvent.objects.filter(run_id=approval.run_id).count()
    with pytest.raises(errors.DecisionError, match=message):
        services.approve(approval.id, user=approver, edited_args=edited)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and approval.decided_by is None
    assert Run.objects.get(id=approval.run_id).status == RunStatus.WAITING
    assert RunEvent.objects.filter(run_id=approval.run_id).count() == events_before


def test_an_at_least_requested_number_may_only_be_raised_up_to_its_maximum(approver):
    script = [{"calls": [["ap_hold", {"order_id": "ORD-1001", "days": 7}]]}, {"text": "held"}]
    run = advance(start_run("ap-hold", {"script": script}).run)
    approval = Approval.objects.get(run=run)
    for days, rule, words in [
        (6, "at_least_requested", "days must be at least 7"),  # lowered
        (31, "maximum", "days must be at most 30"),  # past the rule's maximum
        (7.5, "type", "days must be an integer"),
    ]:
        with pytest.raises(errors.EditNotAllowed) as refused:
            services.approve(approval.id, user=approver, edited_args={"days": days})
        assert (refused.value.field, refused.value.rule) == ("days", rule)
        assert words in str(refused.value)
        if rule != "type":  # the rule in words, as the inbox shows it
            assert "may only be raised: from 7 (the requested value) up to 30" in str(refused.value)
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.PENDING
    services.approve(approval.id, user=approver, edited_args={"days": 30})
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED
    assert CALLS["ap_hold"] == [("ORD-1001", 30)]  # the raised value, once


def test_reject_feeds_the_reason_back_to_the_agent(
    approver, django_capture_on_commit_callbacks, monkeypatch
):
    from agentruns.runtime.providers import scripted_model

    seen: list[list[dict]] = []  # what the (scripted) model was sent, turn by turn
    convert = scripted_model.engine_messages

    def spy(messages, playing):
        seen.append(converted := convert(messages, playing))
        return converted

    monkeypatch.setattr(scripted_model, "engine_messages", spy)
    approval = parked_approval()
    with django_capture_on_commit_callbacks(execute=True):
        services.reject(approval.id, user=approver, reason="outside the 30-day window")
    step = Step.objects.get(id=approval.step_id)
    assert step.status == StepStatus.REJECTED
    assert step.result == {"error": "rejected", "reason": "outside the 30-day window"}
    run = advance(Run.objects.get(id=approval.run_id))
    assert run.status == RunStatus.SUCCEEDED
    assert CALLS["ap_refund"] == []
    # the model's next turn saw the rejection as the tool's result
    tool_answers = [m for m in seen[-1] if m.get("role") == "tool"]
    assert "outside the 30-day window" in str(tool_answers[-1]["content"])
    (event,) = events(run.id, "approval.decided")
    assert (
        event.data["decision"] == "rejected" and event.data["reason"] == "outside the 30-day window"
    )


def test_second_decision_changes_nothing_and_names_the_winner(
    approver, lead, django_capture_on_commit_callbacks
):
    approval = parked_approval()
    with django_capture_on_commit_callbacks(execute=True):
        services.approve(approval.id, user=approver)
    events = RunEvent.objects.filter(run_id=approval.run_id).count()
    tasks = queued_tasks_for(approval.run_id)
    for attempt in (
        lambda: services.reject(approval.id, user=lead, reason="no"),
        lambda: services.approve(approval.id, user=lead),
        lambda: services.approve(approval.id, user=lead, edited_args={"amount_cents": "invalid"}),
    ):
        with pytest.raises(errors.AlreadyDecided, match=r"already approved by approver at \d{4}-"):
            attempt()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by.username == "approver"
    assert RunEvent.objects.filter(run_id=approval.run_id).count() == events
    assert queued_tasks_for(approval.run_id) == tasks


def test_approver_limit_refuses_above_and_allows_lowered_or_lead(approver, lead, settings):
    settings.AGENTRUNS_APPROVER_LIMIT_CENTS = 3000
    approval = parked_approval(amount=4599)
    with pytest.raises(errors.DecisionError, match="45.99 is above your approval limit of 30.00"):
        services.approve(approval.id, user=approver)
    assert Approval.objects.get(id=approval.id).status == ApprovalStatus.PENDING
    services.approve(approval.id, user=approver, edited_args={"amount_cents": 3000})
    assert Approval.objects.get(id=approval.id).edited_args["amount_cents"] == 3000
    other = parked_approval(amount=9999)
    services.approve(other.id, user=lead)  # leads (superusers) have no limit
    assert Approval.objects.get(id=other.id).status == ApprovalStatus.APPROVED


def test_expiry_through_the_sweeper_rejects_with_reason_expired(
    settings, django_capture_on_commit_callbacks
):
    settings.AGENTRUNS_APPROVAL_EXPIRY_SECONDS = 60
    approval = parked_approval()
    assert approval.expires_at is not None
    assert outcomes.expire_due_approvals(timezone.now()) == 0  # not due yet
    with django_capture_on_commit_callbacks(execute=True):
        sweep(now=timezone.now() + timedelta(seconds=61))
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED and approval.reason == "expired"
    assert approval.decided_by is None
    step = Step.objects.get(id=approval.step_id)
    assert step.status == StepStatus.REJECTED and step.result == {
        "error": "rejected",
        "reason": "expired",
    }
    run = advance(Run.objects.get(id=approval.run_id))
    assert run.status == RunStatus.SUCCEEDED and CALLS["ap_refund"] == []
    with pytest.raises(errors.AlreadyDecided, match="already expired by the system"):
        services.approve(approval.id, user=None)


def test_cancelled_run_withdraws_and_a_late_decision_is_told(approver):
    approval = parked_approval()
    cancel_run(approval.run_id, user=approver, reason="customer withdrew")
    with pytest.raises(errors.AlreadyDecided, match="withdrawn"):
        services.approve(approval.id, user=approver)


def test_reconcile_happened_keeps_the_single_send_and_continues(
    approver, django_capture_on_commit_callbacks
):
    approval = unknown_step_approval()
    assert len(CALLS["ap_notify"]) == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.reconcile(
            approval.id,
            user=approver,
            resolution="happened",
            result={"sent": "ada@example.com", "checked": "mail log"},
        )
    step = Step.objects.get(id=approval.step_id)
    assert step.status == StepStatus.SUCCEEDED and step.result["checked"] == "mail log"
    run = advance(Run.objects.get(id=approval.run_id))
    assert run.status == RunStatus.SUCCEEDED and run.output == "All done."
    assert len(CALLS["ap_notify"]) == 1  # never sent twice
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.RESOLVED and approval.resolution == "happened"
    assert events(run.id, "approval.decided")[0].data["decision"] == "reconciled: happened"


def test_reconcile_retry_runs_the_step_again_with_the_same_key(
    approver, django_capture_on_commit_callbacks
):
    approval = unknown_step_approval()
    with django_capture_on_commit_callbacks(execute=True):
        services.reconcile(approval.id, user=approver, resolution="retry")
    run = advance(Run.objects.get(id=approval.run_id))
    assert run.status == RunStatus.SUCCEEDED
    step = Step.objects.get(id=approval.step_id)
    assert step.status == StepStatus.SUCCEEDED and step.result == {"sent": "ada@example.com"}
    assert [(key, attempt) for key, attempt, _ in CALLS["ap_notify"]] == [
        (step.idempotency_key, 1),
        (step.idempotency_key, 2),
    ]


def test_reconcile_abort_ends_the_run(approver):
    approval = unknown_step_approval()
    queued_before = queued_tasks_for(approval.run_id)
    services.reconcile(
        approval.id, user=approver, resolution="abort", reason="mail server says maybe"
    )
    run = Run.objects.get(id=approval.run_id)
    assert run.status == RunStatus.FAILED and run.stop_reason == "aborted"
    assert "aborted by approver" in run.error
    # the call may have happened: the step stays unknown, and no door runs it again
    assert Step.objects.get(id=approval.step_id).status == StepStatus.UNKNOWN
    assert queued_tasks_for(run.id) == queued_before  # nothing more runs: no worker is rung
    types = event_types(run)
    assert types[-2:] == ["approval.decided", "run.status"]
    with pytest.raises(errors.AlreadyDecided):
        services.reconcile(approval.id, user=approver, resolution="retry")


def test_kind_mismatch_is_refused(approver):
    approval = unknown_step_approval()
    with pytest.raises(errors.DecisionError, match="reconciliation"):
        services.approve(approval.id, user=approver)
    with pytest.raises(errors.DecisionError, match="resolution must be"):
        services.reconcile(approval.id, user=approver, resolution="maybe")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("second", ["approve", "reject"])
def test_race_two_deciders_exactly_one_wins_and_the_run_is_enqueued_once(approver, lead, second):
    approval = parked_approval()
    tasks_before = queued_tasks_for(approval.run_id)
    seconds = {
        "approve": lambda: services.approve(
            approval.id, user=lead, edited_args={"amount_cents": 1234}
        ),
        "reject": lambda: services.reject(approval.id, user=lead, reason="duplicate request"),
    }
    outcomes = race(lambda: services.approve(approval.id, user=approver), seconds[second])
    kinds = sorted("won" if isinstance(v, Approval) else type(v).__name__ for v in outcomes)
    assert kinds == ["AlreadyDecided", "won"], outcomes
    loser = next(v for v in outcomes if isinstance(v, errors.AlreadyDecided))
    approval.refresh_from_db()
    assert approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
    assert loser.approval.decided_by_id == approval.decided_by_id
    assert len(events(approval.run_id, "approval.decided")) == 1
    assert (
        RunEvent.objects.filter(
            run_id=approval.run_id, type="run.status", data__status="queued"
        ).count()
        == 1
    )  # resumed once
    assert queued_tasks_for(approval.run_id) == tasks_before + 1
    assert_gapless(approval.run_id)


# ------------------------------------------------------------------ approved, then interrupted
def test_reconciling_an_approved_call_keeps_who_approved_it(approver, lead):
    run = start_run(
        "ap-wire",
        {
            "script": [
                {"calls": [["ap_wire", {"account": "DE00-SECRET", "amount_cents": 700}]]},
                {"text": "ok"},
            ]
        },
    ).run
    run = advance(run)
    approval = Approval.objects.get(run=run)
    services.approve(approval.id, user=approver, reason="checked the invoice")
    CRASH_NEXT["ap_wire"] = True
    run = die_mid_call_then_recover(run)
    assert run.status == RunStatus.WAITING
    reconciliation = Approval.objects.get(run=run)  # the same row: one per step
    assert reconciliation.id == approval.id
    assert (
        reconciliation.kind == ApprovalKind.RECONCILIATION
        and reconciliation.status == ApprovalStatus.PENDING
    )
    assert reconciliation.decided_by is None
    [earlier] = reconciliation.history
    assert earlier["kind"] == "approval" and earlier["status"] == "approved"
    assert earlier["decided_by"] == approver.username and earlier["reason"] == "checked the invoice"
    assert earlier["decided_at"]

    listed = ApiClient(lead).get("/api/approvals?status=pending").json()
    [item] = [a for a in listed["approvals"] if a["id"] == approval.id]
    assert item["history"][0]["decided_by"] == approver.username
    # redacted in the history as in the args (the run's own input, shown as the request, holds
    # the script here, so only these fields are checked)
    assert "DE00-SECRET" not in str(item["history"]) + str(item["requested_args"])

    inbox = Client()
    inbox.force_login(approver)
    page = inbox.get("/approvals/?kind=reconciliation").content.decode()
    assert (
        f"Before the call: approved by {approver.username}" in page
        and "checked the invoice" in page
    )

    services.reconcile(
        reconciliation.id, user=approver, resolution="happened", result={"wired": 700}
    )
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED
    assert CALLS["ap_wire"] == [(1, 700)]  # never sent twice
