"""An unknown outcome is never executed again without a person saying it did not happen
(runtime/execution/unknown_outcomes.py), by every door: retry (service, API, run page), resolve,
fork, a reconciliation answer, bulk decisions (API and inbox), the chat's approval answers.

The demo's refund agent mails the customer with `send_customer_reply` (`idempotency="none"`);
the mail is cut right after it went out (the failpoint `tool_returned:send_customer_reply`, in
process: tests/testkit.py `Cut`), the step is unknown and its reconciliation item is answered.
Every test counts the outbox's own rows (`support.OutboxMessage`), what the customer gets.
tests/approvals/test_real_worker.py runs the same story with a real worker and a real SIGKILL.
"""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.test import Client

from agentruns.api.chat import chat_dedupe_key
from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.registry import Agent, register_agent
from agentruns.services import ActionRefused, fork_run, retry_run, start_run
from agentruns.stream.ui_chunks import chunks_of
from approvals import services as decisions
from approvals.errors import AlreadyDecided
from approvals.models import Approval
from support.models import OutboxMessage, TicketNote
from tests.helpers import ApiClient, advance, events, make_user
from tests.testkit import (
    REPLY_STEP,
    REPLY_TURN,
    aborted_reply_run,
    failed_shipping_run,
    unknown_reply_run,
)
from tests.web.test_health import families, samples

pytestmark = pytest.mark.django_db


def mails(run: Run) -> int:
    """What the customer got from this run: the outbox's rows."""
    return OutboxMessage.objects.filter(run_id=run.id).count()


def mails_for_order(order_id: str = "ORD-1007") -> int:
    return OutboxMessage.objects.filter(order__order_id=order_id).count()


def reply_step(run: Run) -> Step:
    return Step.objects.get(run=run, index=REPLY_STEP)


def item_of(run: Run) -> Approval:
    return Approval.objects.get(step=reply_step(run))


@pytest.fixture
def lead(seeded, django_user_model):
    """The demo's lead (every permission), as seed_demo made it."""
    return django_user_model.objects.get(username="lead")


@pytest.fixture
def aborted(lead, monkeypatch) -> Run:
    run = aborted_reply_run(lead, monkeypatch)
    assert mails(run) == 1  # the mail went out before the cut
    return run


def assert_untouched(run: Run) -> None:
    """Whatever the door answered, nothing ran: one mail, the step still unknown."""
    advance(Run.objects.get(id=run.id))  # a worker would find nothing to do
    assert mails(run) == 1
    assert reply_step(run).status == StepStatus.UNKNOWN
    assert Run.objects.get(id=run.id).status == RunStatus.FAILED


# ------------------------------------------------------------------ retry
def test_retry_refuses_an_aborted_unknown_outcome_and_says_what_to_do(aborted, lead):
    with pytest.raises(ActionRefused) as refused:
        retry_run(aborted.id, user=lead)
    reason = str(refused.value)
    assert f"step #{REPLY_STEP} send_customer_reply has an unknown outcome" in reason
    assert f"resolve step #{REPLY_STEP}" in reason and f"fork from step #{REPLY_TURN}" in reason
    assert_untouched(aborted)
    assert not events(aborted, "run.retried")


def test_retry_through_the_api_is_a_409_with_the_reason(aborted, lead):
    response = ApiClient(lead).post(f"/api/runs/{aborted.id}/retry")
    assert response.status_code == 409, response.content
    assert "never run again" in response.json()["error"]
    assert_untouched(aborted)


def test_the_run_page_offers_no_retry_and_its_retry_post_is_refused(aborted, lead):
    client = Client()
    client.force_login(lead)
    page = client.get(f"/runs/{aborted.id}/").content.decode()
    assert 'id="retry-unknown"' in page and "Retry from failed step" not in page
    assert f"step #{REPLY_STEP} <code>send_customer_reply</code>" in page
    assert "Outcome unknown: it is never run again" in page  # the resolve form says so
    response = client.post(f"/runs/{aborted.id}/retry/", follow=True)
    assert "never run again" in response.content.decode()
    assert_untouched(aborted)


def test_the_retry_button_of_a_failed_run_tells_the_truth_about_unknown_steps(lead):
    client = Client()
    client.force_login(lead)
    page = client.get(f"/runs/{failed_shipping_run().id}/").content.decode()
    assert "Retry from failed step" in page
    assert "nor is a step whose outcome is unknown" in page


def test_a_run_whose_policy_is_skip_continues_after_the_step_and_never_mails_again(aborted, lead):
    Run.objects.filter(id=aborted.id).update(retry_unknown="skip")  # as frozen from its agent
    client = Client()
    client.force_login(lead)
    page = client.get(f"/runs/{aborted.id}/").content.decode()
    assert f"Retry, skipping step #{REPLY_STEP} (outcome unknown)" in page
    retry_run(aborted.id, user=lead)
    run = advance(Run.objects.get(id=aborted.id))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert mails(run) == 1
    step = reply_step(run)
    assert step.status == StepStatus.SKIPPED and "was not made again" in step.error
    assert events(run, "step.skipped")[0].data["step"] == REPLY_STEP
    assert events(run, "run.retried")[0].data["skipped"] == [REPLY_STEP]
    # a new call of the tool in this run is a person's decision
    marked = run.permissions["tools"]["send_customer_reply"]
    assert marked["approval"] == "always" and "unknown outcome" in marked["approval_because"]
    # the AI SDK stream settles the call with why it was not made again
    recorded = [(e.seq, e.type, e.data) for e in events(run)]
    settled = [c for c in chunks_of(run.id, recorded) if c.get("type") == "tool-output-error"]
    assert any("was not made again" in c["errorText"] for c in settled)


def test_an_agent_declares_the_policy_and_the_run_freezes_it():
    register_agent(Agent(name="skipper", instructions="-", tools=["t_email"], retry_unknown="skip"))
    assert start_run("skipper", {}).run.retry_unknown == "skip"
    assert start_run("script", {"script": []}).run.retry_unknown == "refuse"  # the default
    with pytest.raises(ValueError, match="retry_unknown must be 'refuse' or 'skip'"):
        register_agent(Agent(name="maybe", instructions="-", retry_unknown="sometimes"))


# ------------------------------------------------------------------ resolve: "it happened"
@pytest.mark.parametrize("door", ["api", "page"])
def test_resolving_the_step_with_its_result_continues_without_a_second_mail(aborted, lead, door):
    sent = OutboxMessage.objects.get(run_id=aborted.id)
    result = {"outbox_id": sent.pk, "to": "customer"}
    if door == "api":
        response = ApiClient(lead).post(
            f"/api/runs/{aborted.id}/steps/{REPLY_STEP}/resolve", {"result": result}
        )
        assert response.status_code == 200, response.content
    else:
        client = Client()
        client.force_login(lead)
        client.post(
            f"/runs/steps/{reply_step(aborted).id}/resolve/",
            {"result": f'{{"outbox_id": {sent.pk}, "to": "customer"}}'},
        )
    step = reply_step(aborted)
    assert step.status == StepStatus.SUCCEEDED and step.result == result
    run = advance(Run.objects.get(id=aborted.id))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert mails(run) == 1


# ------------------------------------------------------------------ the reconciliation answers
def test_an_aborted_item_takes_no_second_answer_by_any_door(aborted, lead):
    item = item_of(aborted)
    with pytest.raises(AlreadyDecided):
        decisions.reconcile(item.id, user=lead, resolution="retry")
    response = ApiClient(lead).post(f"/api/approvals/{item.id}", {"decision": "retry"})
    assert response.status_code == 409, response.content
    client = Client()
    client.force_login(lead)
    client.post(f"/approvals/{item.id}/decide/", {"action": "retry"}, HTTP_HX_REQUEST="true")
    assert_untouched(aborted)


@pytest.mark.parametrize(
    "answer, sent", [("happened", 1), ("retry", 2)]
)  # "it did not happen: retry" is a person saying so: the one way it runs again
def test_the_answers_that_settle_an_unknown_outcome(lead, monkeypatch, answer, sent):
    run = unknown_reply_run(lead, monkeypatch)
    assert mails(run) == 1
    response = ApiClient(lead).post(f"/api/approvals/{item_of(run).id}", {"decision": answer})
    assert response.status_code == 200, response.content
    run = advance(Run.objects.get(id=run.id))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert mails(run) == sent


# ------------------------------------------------------------------ bulk and the chat
def test_a_run_held_for_reconciliation_waits_for_an_approval_in_metrics(
    lead, monkeypatch, client, settings
):
    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 0  # another test's scrape may be cached
    run = unknown_reply_run(lead, monkeypatch)
    assert ApiClient(lead).get(f"/api/runs/{run.id}").json()["waiting_for"]["kind"] == "approval"
    waiting = samples(families(client)["agentruns_runs_waiting_for"])
    assert waiting[(("kind", "approval"),)] == 1


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_bulk_decisions_never_settle_a_reconciliation(lead, monkeypatch, decision):
    run = unknown_reply_run(lead, monkeypatch)
    item = item_of(run)
    api = ApiClient(lead)
    # (a rejection needs a reason or an internal note since issue 34: both decisions carry one)
    bulk = {"ids": [item.id], "decision": decision, "reason": "bulk"}
    pending = api.post("/api/approvals/bulk", bulk)
    assert pending.status_code == 200, pending.content
    assert pending.json()["results"][0]["code"] == "wrong_kind"
    client = Client()
    client.force_login(lead)
    action = {"action": decision, "ids": [f"{item.id}.1"], "reason": "bulk", "confirm": "1"}
    client.post("/approvals/bulk/", action, HTTP_HX_REQUEST="true")
    item.refresh_from_db()
    assert item.status == "pending"
    assert advance(Run.objects.get(id=run.id)).status == RunStatus.WAITING
    decisions.reconcile(item.id, user=lead, resolution="abort")
    after = api.post("/api/approvals/bulk", bulk)
    assert after.json()["results"][0]["code"] == "already_decided"
    client.post("/approvals/bulk/", action, HTTP_HX_REQUEST="true")
    assert_untouched(run)


def test_the_chats_approval_answer_cannot_settle_a_reconciliation(
    lead, monkeypatch, django_user_model
):
    chatter = make_user(
        django_user_model,
        "chatter",
        [
            "agentruns.view_run",
            "agentruns.start_run",
            "approvals.view_approval",
            "approvals.decide_approval",
        ],
    )
    run = unknown_reply_run(lead, monkeypatch, dedupe_key=chat_dedupe_key("c1", chatter))
    item = item_of(run)
    body = {
        "id": "c1",
        "trigger": "submit-message",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund please"}]},
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    {
                        "type": "tool-send_customer_reply",
                        "toolCallId": "x",
                        "state": "approval-responded",
                        "approval": {"id": str(item.id), "approved": True},
                    }
                ],
            },
        ],
    }
    api = ApiClient(chatter)
    pending = api.post("/api/chat/refund", body)
    assert pending.status_code == 409 and "reconciliation" in pending.json()["error"]
    assert advance(Run.objects.get(id=run.id)).status == RunStatus.WAITING
    decisions.reconcile(item.id, user=lead, resolution="abort")
    assert api.post("/api/chat/refund", body).status_code == 409
    assert_untouched(run)


# ------------------------------------------------------------------ fork
@pytest.mark.parametrize("approve_repeats", [True, False])
def test_a_fork_before_the_unknown_mail_parks_it_whatever_the_forker_chose(
    aborted, lead, approve_repeats
):
    fork = fork_run(aborted.id, REPLY_TURN, user=lead, approve_repeats=approve_repeats)
    notes = TicketNote.objects.count()
    fork = advance(fork)
    assert fork.status == RunStatus.WAITING, fork.error
    parked = Approval.objects.get(run=fork, status="pending")
    # the note (known to have happened) is the forker's choice; the mail always waits
    assert parked.tool == ("add_ticket_note" if approve_repeats else "send_customer_reply")
    assert TicketNote.objects.count() == notes + (0 if approve_repeats else 1)
    assert mails_for_order() == 1 and mails(fork) == 0


# ------------------------------------------------------------------ the engine itself
def test_the_executor_never_runs_an_unknown_step(aborted):
    # a door that wrongly queued the run again: the worker parks it, it does not mail
    Run.objects.filter(id=aborted.id).update(status=RunStatus.QUEUED)
    assert advance(Run.objects.get(id=aborted.id)).status == RunStatus.WAITING
    assert mails(aborted) == 1 and reply_step(aborted).status == StepStatus.UNKNOWN


def test_steps_aborted_before_this_rule_become_unknown(aborted, lead):
    # as an abort left them before: failed, so a retry would have mailed again
    Step.objects.filter(id=reply_step(aborted).id).update(status=StepStatus.FAILED)
    migration = importlib.import_module(
        "approvals.migrations.0007_aborted_unknown_steps_stay_unknown"
    )
    migration.forwards(apps, None)
    assert reply_step(aborted).status == StepStatus.UNKNOWN
    with pytest.raises(ActionRefused):
        retry_run(aborted.id, user=lead)
    assert_untouched(aborted)
