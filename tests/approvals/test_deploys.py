"""Deploys with parked runs (issue 19 item 6): a deploy renamed or removed the parked call's
tool, changed its schema under the parked arguments, or removed the run's agent. The inbox card,
the API and the run page say so; approving is refused with a 409 and that reason (the call is
never executed); rejecting and cancelling work; the rest of the inbox is untouched. A run whose
agent is missing waits instead of failing and continues once the agent is back. The deploy is
simulated by changing the registry, as a new release's import would; the same with real worker
processes started without and then with the agent's module: test_deploys_worker.py."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
from django.test import Client
from django.utils import timezone

from agentruns import registry
from agentruns.models import Run, RunStatus, StepStatus
from agentruns.registry import tools as registry_tools
from approvals.models import Approval, ApprovalStatus
from tests.helpers import ApiClient, advance

from .kit import CALLS, login, parked_approval

pytestmark = pytest.mark.django_db
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def deploy() -> Iterator[dict]:
    """What the test removes or replaces in the registry is put back afterwards."""
    tools, agents = dict(registry_tools._tools), dict(registry._agents)
    yield {"tools": registry_tools._tools, "agents": registry._agents}
    registry_tools._tools.clear()
    registry_tools._tools.update(tools)
    registry._agents.clear()
    registry._agents.update(agents)


def changed_schema() -> registry.Tool:
    tool = registry_tools._tools["ap_refund"]
    parameters = {
        **tool.parameters,
        "properties": {**tool.parameters["properties"], "currency": {"type": "string"}},
        "required": [*tool.parameters["required"], "currency"],
    }
    return dataclasses.replace(tool, parameters=parameters, _compiled=None, _simple=None)


def approve(user, approval: Approval):
    return ApiClient(user).post(f"/api/approvals/{approval.id}", {"decision": "approve"})


def unreadable_schema() -> registry.Tool:
    """A release whose schema the validator cannot read (and the card's form cannot use)."""
    tool = registry_tools._tools["ap_refund"]
    amount = {**tool.parameters["properties"]["amount_cents"], "minimum": "one"}
    parameters = {
        **tool.parameters,
        "properties": {**tool.parameters["properties"], "amount_cents": amount},
    }
    return dataclasses.replace(tool, parameters=parameters, _compiled=None, _simple=None)


CASES = {
    "tool removed": (
        lambda d: d["tools"].pop("ap_refund"),
        "the tool ap_refund is not deployed any more",
    ),
    "schema changed": (
        lambda d: d["tools"].update(ap_refund=changed_schema()),
        "the arguments no longer fit the deployed schema of ap_refund",
    ),
    "schema unreadable": (
        lambda d: d["tools"].update(ap_refund=unreadable_schema()),
        "the deployed schema of ap_refund cannot check these arguments",
    ),
    "agent removed": (
        lambda d: d["agents"].pop("ap-script"),
        "the agent ap-script is not deployed any more",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_inbox_and_the_run_page_say_it_and_approving_is_a_409(approver, deploy, case):
    change, reason = CASES[case]
    broken, fine = parked_approval(), parked_approval()
    registry_tools._tools["ap_fine"] = dataclasses.replace(
        registry_tools._tools["ap_refund"], name="ap_fine"
    )
    Approval.objects.filter(id=fine.id).update(tool="ap_fine", agent="ap-hold")
    change(deploy)

    client = login(Client(), approver)
    inbox = client.get("/approvals/")
    assert inbox.status_code == 200
    html = inbox.content.decode()
    assert html.count("This call cannot run") == 1 and reason in html
    assert f'id="approval-{fine.id}"' in html  # the other item is as it was
    run_page = client.get(f"/runs/{broken.run_id}/").content.decode()
    assert "This call cannot run" in run_page and reason in run_page
    listed = {a["id"]: a for a in ApiClient(approver).get("/api/approvals").json()["approvals"]}
    assert reason in listed[broken.id]["cannot_run"] and listed[fine.id]["cannot_run"] == ""

    refused = approve(approver, broken)
    assert refused.status_code == 409 and reason in refused.json()["error"]
    assert refused.json()["approval"]["status"] == "pending"
    bulk = ApiClient(approver).post(
        "/api/approvals/bulk", {"ids": [broken.id], "decision": "approve"}
    )
    assert bulk.json()["results"][0]["code"] == "not_runnable"
    form = client.post(
        f"/approvals/{broken.id}/decide/", {"action": "approve", "version": "1"}, **HX
    )
    assert form["X-Decision-Status"] == "409" and reason in form.content.decode()
    assert Approval.objects.get(id=broken.id).status == ApprovalStatus.PENDING

    rejected = ApiClient(approver).post(
        f"/api/approvals/{broken.id}", {"decision": "reject", "reason": "gone in the deploy"}
    )
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    run = advance(broken.run)
    assert CALLS["ap_refund"] == []  # never executed
    if case == "agent removed":  # it waits for its agent instead of failing
        assert run.status == RunStatus.QUEUED and "not deployed in this worker" in run.error
    else:
        assert run.status == RunStatus.SUCCEEDED, run.error


def test_cancelling_a_run_parked_on_a_call_that_cannot_run(lead, deploy):
    approval = parked_approval()
    deploy["tools"].pop("ap_refund")
    deploy["agents"].pop("ap-script")
    response = ApiClient(lead).post(f"/api/runs/{approval.run_id}/cancel")
    assert response.status_code in (200, 202), response.content
    run = Run.objects.get(id=approval.run_id)
    assert run.status == RunStatus.CANCELLED
    assert Approval.objects.get(id=approval.id).status != ApprovalStatus.PENDING


def advance_when_due(run: Run) -> Run:
    """Its next doorbell: rung when its wait is over (a doorbell before then finds it not due)."""
    time.sleep(max(0.0, (run.enqueued_at - timezone.now()).total_seconds()))
    return advance(run)


def test_a_run_whose_agent_is_missing_waits_and_continues_when_it_is_back(
    approver, deploy, settings
):
    settings.AGENTRUNS_AGENT_MISSING_RETRY_SECONDS = 0.1  # its next look, soon
    approval = parked_approval()
    agent = deploy["agents"].pop("ap-script")
    ApiClient(approver).post(
        f"/api/approvals/{approval.id}", {"decision": "reject", "reason": "not now"}
    )
    waiting = advance(approval.run)
    assert waiting.status == RunStatus.QUEUED and waiting.lease_owner == ""
    assert "unknown agent 'ap-script'" in waiting.error
    page = login(Client(), approver).get(f"/runs/{waiting.id}/").content.decode()
    assert "Waiting to start: unknown agent" in page  # the banner says why
    first_look = waiting.enqueued_at
    again = advance_when_due(waiting)  # the next look: still no agent, still waiting
    assert again.status == RunStatus.QUEUED and again.enqueued_at > first_look

    deploy["agents"]["ap-script"] = agent  # the next deploy brings it back
    done = advance_when_due(again)
    assert done.status == RunStatus.SUCCEEDED and done.error == ""
    assert done.steps.get(index=approval.step.index).status == StepStatus.REJECTED


def test_an_approved_call_whose_tool_left_before_it_ran_is_not_made(approver, deploy):
    approval = parked_approval()
    assert approve(approver, approval).status_code == 200
    deploy["tools"].pop("ap_refund")  # the deploy lands between the approval and the call
    run = advance(approval.run)
    assert CALLS["ap_refund"] == []
    step = run.steps.get(index=approval.step.index)
    assert step.status == StepStatus.REJECTED and "not deployed any more" in step.error
    assert run.status == RunStatus.SUCCEEDED, run.error
