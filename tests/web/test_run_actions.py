"""Operator actions as services: retry, cancel (in every live status), resolve, and their audit."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.utils import timezone

from agentruns.models import (
    AttemptOutcome,
    Run,
    RunStatus,
    Step,
    StepAttempt,
    StepKind,
    StepStatus,
)
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.values.ids import step_key
from agentruns.services import ActionRefused, cancel_run, fork_run, resolve_step, retry_run
from approvals.domain.selectors import approvals_query
from approvals.models import Approval, ApprovalStatus
from approvals.services import AlreadyDecided, approve
from tests import testkit
from tests.helpers import advance, assert_gapless, events, script_run, steps
from tests.procs import wait_until
from tests.testkit import OPS_AGENT, failed_shipping_run, succeeded_run_to_fork


def step_at(run: Run, index: int) -> Step:
    return Step.objects.get(run=run, index=index)


# ------------------------------------------------------------------ retry
@pytest.mark.django_db
def test_retry_reruns_only_the_failed_step_with_the_same_key(operator):
    testkit.FAILS["t_charge"] = 3  # exactly the tool's max_attempts: the step fails for good
    run = script_run(
        [
            {
                "text": "echo then charge",
                "calls": [["t_echo", {"text": "hi"}], ["t_charge", {"amount": 9}]],
            },
            {"text": "charged"},
        ],
        agent=OPS_AGENT,
    )
    run = advance(run)
    assert run.status == RunStatus.FAILED
    charge = step_at(run, 2)
    assert charge.status == StepStatus.FAILED and charge.attempts == 3
    assert "temporary outage" in run.error

    retry_run(run.id, user=operator)
    run.refresh_from_db()
    charge.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.error == "" and run.finished_at is None
    assert charge.status == StepStatus.PENDING and charge.attempts == 3
    audit = events(run, "step.retry_requested", "run.retried")
    assert [e.type for e in audit] == ["step.retry_requested", "run.retried"]
    assert audit[0].data["by"] == "operator" and audit[0].data["step"] == 2
    assert audit[0].data["idempotency_key"] == charge.idempotency_key
    # the retry's own event has no error of its own; the failure it answers is named as such
    assert audit[0].data["error"] == ""
    assert "temporary outage" in audit[0].data["previous_error"]

    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED and run.output == "charged"
    charge.refresh_from_db()
    assert charge.status == StepStatus.SUCCEEDED and charge.attempts == 4
    # same step row, a new attempt, the same key on every call the tool ever received
    assert {key for key, _, _ in testkit.CALLS["t_charge"]} == {charge.idempotency_key}
    assert [attempt for _, attempt, _ in testkit.CALLS["t_charge"]] == [1, 2, 3, 4]
    outcomes = list(charge.attempt_rows.order_by("number").values_list("outcome", flat=True))
    assert outcomes == ["retrying", "retrying", "failed", "succeeded"]
    # completed steps were not executed again: one echo call, one attempt on the first model turn
    assert len(testkit.CALLS["t_echo"]) == 1
    assert step_at(run, 0).attempts == 1 and step_at(run, 1).attempts == 1
    assert Step.objects.filter(run=run).count() == 4
    assert_gapless(run)


@pytest.mark.django_db
def test_retry_after_a_stop_condition_extends_the_limit_and_continues(operator, settings):
    settings.AGENTRUNS_DEFAULT_MAX_STEPS = 4
    run = script_run(
        [{"calls": [["t_echo", {"text": "again"}]], "loop": True}], agent="script-short"
    )
    run = advance(run)
    assert run.status == RunStatus.FAILED and run.stop_reason == "max_steps"
    first_steps = list(Step.objects.filter(run=run).values_list("id", "attempts"))
    assert len(first_steps) >= 5

    retry_run(run.id, user=operator)
    run.refresh_from_db()
    assert run.max_steps == 9
    assert events(run, "run.retried")[0].data["extended"] == {"max_steps": 9}
    run = advance(run)
    assert run.status == RunStatus.FAILED and run.stop_reason == "max_steps"
    assert Step.objects.filter(run=run).count() >= 9 > len(first_steps)
    # the first five steps are the same rows, never run again
    for step_id, attempts in first_steps:
        assert Step.objects.get(id=step_id).attempts == attempts


@pytest.mark.django_db
@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.SUCCEEDED, RunStatus.CANCELLED])
def test_retry_is_refused_unless_the_run_failed(operator, status):
    run = script_run([{"text": "x"}], agent=OPS_AGENT)
    Run.objects.filter(id=run.id).update(status=status)
    with pytest.raises(ActionRefused, match="only failed runs"):
        retry_run(run.id, user=operator)
    assert not events(run, "run.retried")


# ------------------------------------------------------------------ cancel, per status
@pytest.mark.django_db
def test_cancel_a_queued_run_before_any_worker_claims_it(operator):
    run = script_run([{"text": "never"}], agent=OPS_AGENT)
    cancel_run(run.id, user=operator, reason="customer withdrew")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.stop_reason == "cancelled"
    assert run.error == "customer withdrew" and run.finished_at is not None
    # the task q2 still delivers finds nothing to do
    assert RunExecutor(run.id).advance() == "busy"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and not Step.objects.filter(run=run).exists()
    requested = events(run, "run.cancel_requested")[0]
    assert requested.data == {"by": "operator", "reason": "customer withdrew", "status": "queued"}
    assert events(run)[-1].data["status"] == "cancelled"
    with pytest.raises(ActionRefused, match="already cancelled"):
        cancel_run(run.id, user=operator)
    assert_gapless(run)


@pytest.mark.django_db(transaction=True)
def test_cancel_a_running_run_stops_at_the_next_step_boundary(operator):
    testkit.GATE.clear()  # t_charge blocks inside its call until released
    run = script_run(
        [{"calls": [["t_charge", {"amount": 3}]]}, {"text": "must never be said"}], agent=OPS_AGENT
    )

    def work() -> None:
        try:
            RunExecutor(run.id).advance()
        finally:
            connection.close()  # this thread's own connection, or test teardown waits on it

    worker = threading.Thread(target=work)
    worker.start()
    try:
        wait_until(
            lambda: Step.objects.filter(
                run=run, tool="t_charge", status=StepStatus.RUNNING
            ).exists(),
            timeout=60,
            message="t_charge running",
        )
        flagged = cancel_run(run.id, user=operator, reason="wrong customer")
        assert flagged.cancel_requested and flagged.status == RunStatus.RUNNING
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.cancel_requested
        with pytest.raises(ActionRefused, match="already requested"):
            cancel_run(run.id, user=operator)
    finally:
        testkit.GATE.set()
        worker.join(60)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.stop_reason == "cancelled"
    assert not run.cancel_requested and run.lease_owner == ""
    # the call in flight finished and was recorded; nothing after the boundary ran
    charge = Step.objects.get(run=run, tool="t_charge")
    assert charge.status == StepStatus.SUCCEEDED
    assert Step.objects.filter(run=run).count() == 2
    assert "must never be said" not in "".join(
        Step.objects.filter(run=run).values_list("text", flat=True)
    )
    requested = events(run, "run.cancel_requested")[0]
    final = events(run)[-1]
    assert requested.data["status"] == "running" and requested.data["by"] == "operator"
    assert final.type == "run.status" and final.data["status"] == "cancelled"
    assert final.seq > requested.seq
    assert_gapless(run)


@pytest.mark.django_db
def test_cancel_a_waiting_run_withdraws_its_approval(operator, approver):
    run = script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "paid"}], agent=OPS_AGENT)
    run = advance(run)
    assert run.status == RunStatus.WAITING
    approval = Approval.objects.get(run=run)
    assert approval.status == ApprovalStatus.PENDING
    assert approvals_query().filter(id=approval.id).exists()

    cancel_run(run.id, user=operator)
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert approval.status == ApprovalStatus.RESOLVED and approval.resolution == "withdrawn"
    assert not approvals_query().filter(id=approval.id).exists()  # gone from the inbox
    pay = Step.objects.get(run=run, tool="t_pay")
    assert pay.status == StepStatus.SKIPPED
    withdrawn = events(run, "approval.withdrawn")
    assert [e.data["approval"] for e in withdrawn] == [approval.id]
    # an approver who still had the card open cannot revive the run
    with pytest.raises(AlreadyDecided):
        approve(approval.id, user=approver)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert testkit.CALLS["t_pay"] == []
    assert_gapless(run)


@pytest.mark.django_db
def test_cancel_a_running_run_whose_worker_died(operator):
    """Lease expired, a side-effect call in flight: cancelled now, the call's outcome is unknown."""
    run = script_run([{"calls": [["t_charge", {"amount": 1}]]}], agent=OPS_AGENT)
    step_id = uuid.uuid4()
    past = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(id=run.id).update(
        status=RunStatus.RUNNING, lease_owner="dead-worker", lease_expires_at=past
    )
    step = Step.objects.create(
        id=step_id,
        run=run,
        index=0,
        kind=StepKind.TOOL,
        tool="t_charge",
        arguments={"amount": 1},
        idempotency_key=step_key(run.id, step_id),
        status=StepStatus.RUNNING,
        attempts=1,
        started_at=past,
    )
    StepAttempt.objects.create(step=step, number=1, worker="dead-worker", started_at=past)

    cancel_run(run.id, user=operator)
    run.refresh_from_db()
    step.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.lease_owner == ""
    assert step.status == StepStatus.UNKNOWN  # never guess whether a side effect happened
    attempt = step.attempt_rows.get()
    assert attempt.outcome == AttemptOutcome.CRASHED and attempt.finished_at is not None


# ------------------------------------------------------------------ mark step resolved
@pytest.mark.django_db
def test_resolve_a_failed_side_effect_step_continues_the_run(operator):
    run = failed_shipping_run(parcel="P-1", final_text="shipped by hand")
    assert run.status == RunStatus.FAILED
    ship = Step.objects.get(run=run, tool="ops_ship")
    assert ship.status == StepStatus.FAILED and "carrier rejected" in ship.error

    resolve_step(ship.id, {"tracking": "TRK-BYHAND"}, user=operator)
    ship.refresh_from_db()
    run.refresh_from_db()
    assert ship.status == StepStatus.SUCCEEDED and ship.result == {"tracking": "TRK-BYHAND"}
    assert "resolved by operator" in ship.error and "carrier rejected" in ship.error
    assert run.status == RunStatus.QUEUED
    resolved = events(run, "step.resolved")[0]
    assert resolved.data["by"] == "operator" and resolved.data["result"] == {
        "tracking": "TRK-BYHAND"
    }
    # the attempt history stays true: the one real attempt failed
    assert list(ship.attempt_rows.values_list("outcome", flat=True)) == ["failed"]

    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED and run.output == "shipped by hand"
    assert len(testkit.CALLS["ops_ship"]) == 1  # the operator's result stands; no second call
    assert_gapless(run)


@pytest.mark.django_db
def test_resolve_refusals(operator):
    # a bad-arguments step (never ran, fed back to the model) in a run that then succeeded
    run = advance(
        script_run([{"calls": [["ops_ship", {"nope": 1}]]}, {"text": "ok"}], agent=OPS_AGENT)
    )
    bad = Step.objects.get(run=run, tool="ops_ship")
    assert bad.status == StepStatus.FAILED and bad.attempts == 0
    with pytest.raises(ActionRefused):
        resolve_step(bad.id, {"x": 1}, user=operator)
    model = step_at(run, 0)
    with pytest.raises(ActionRefused, match="only a failed tool step"):
        resolve_step(model.id, {"x": 1}, user=operator)

    testkit.FAILS["ops_ship_fatal"] = 1
    failed = advance(script_run([{"calls": [["ops_ship", {"parcel": "P-2"}]]}], agent=OPS_AGENT))
    ship = Step.objects.get(run=failed, tool="ops_ship")
    with pytest.raises(ActionRefused, match="JSON object"):
        resolve_step(ship.id, ["not", "an", "object"], user=operator)
    ship.refresh_from_db()
    assert ship.status == StepStatus.FAILED  # a refusal changes nothing
    assert not events(failed, "step.resolved")


# ------------------------------------------------------------------ fork
@pytest.mark.django_db
def test_fork_from_a_model_step_copies_history_and_continues(operator, lead, client):
    # forking starts a run: it needs start_run besides operate_run
    operator.user_permissions.add(Permission.objects.get(codename="start_run"))
    source = succeeded_run_to_fork()
    assert source.status == RunStatus.SUCCEEDED
    source_steps = steps(source)
    assert [s.kind for s in source_steps] == ["model", "tool", "model", "tool", "model"]

    with pytest.raises(ActionRefused, match="model step"):
        fork_run(source.id, 1, user=operator)
    client.force_login(operator)
    # the confirmation lists the side effect the fork may repeat: t_charge (#3)
    confirm = client.get(f"/runs/{source.id}/fork/?from_step=2").content.decode()
    assert 'data-step="3" data-tool="t_charge"' in confirm
    response = client.post(f"/runs/{source.id}/fork/", {"from_step": 2})
    fork = Run.objects.exclude(id=source.id).get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{fork.id}/"
    copied = steps(fork)
    assert [(s.index, s.kind, s.tool, s.status) for s in copied] == [
        (s.index, s.kind, s.tool, s.status) for s in source_steps[:2]
    ]
    assert {s.id for s in copied}.isdisjoint(s.id for s in source_steps)
    assert {s.idempotency_key for s in copied}.isdisjoint(s.idempotency_key for s in source_steps)
    assert copied[1].result == source_steps[1].result
    assert events(source, "run.forked")[0].data == {
        "by": "operator",
        "into": str(fork.id),
        "from_step": 2,
    }
    assert events(fork, "run.created")[0].data["forked_from"] == str(source.id)

    # the model asked again for the charge the source made: it waits for a person
    fork = advance(fork)
    assert fork.status == RunStatus.WAITING and len(testkit.CALLS["t_charge"]) == 1
    approve(Approval.objects.get(run=fork, tool="t_charge").id, user=lead)
    fork = advance(fork)
    assert fork.status == RunStatus.SUCCEEDED and fork.output == "done"
    assert len(testkit.CALLS["t_echo"]) == 1  # the copied history was not executed again
    keys = [key for key, _, _ in testkit.CALLS["t_charge"]]
    assert len(keys) == 2 and keys[0] != keys[1]  # the fork's new step has its own key
    assert Step.objects.filter(run=fork).count() == 5
    assert_gapless(fork)
    assert_gapless(source)


@pytest.mark.django_db
def test_cancel_flag_left_on_a_parked_run_can_be_completed(operator, client):
    """A cancel that raced the engine parking the run: the flag is set on a waiting run. The
    page's Stop stays available (asking first: it withdraws the approval) and cancelling then
    withdraws the approval as usual."""
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}], agent=OPS_AGENT))
    assert run.status == RunStatus.WAITING
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'class="act-stop"' in page and 'id="stop-confirm"' in page
    cancel_run(run.id, user=operator)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and not run.cancel_requested
    assert Approval.objects.get(run=run).status == ApprovalStatus.RESOLVED
