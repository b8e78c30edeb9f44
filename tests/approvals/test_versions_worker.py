"""The two-person case of issue 24, end to end: daphne, a real worker, the refund gateway.

approver2 edits a refund of 247.11 down to 1.00; an approval of the version from before the edit
(the API's version, a bulk selection, a chat answer to a stream that never showed the edit) is
refused with the current proposal, and the gateway refunds nothing until the current version is
approved; then exactly the edited amount. (A chat is its user's own, so the chat's answer comes
from the chat's owner: the run's starter, who may not approve a two-person item but whose stale
answer is refused as stale first.)"""

from __future__ import annotations

import json

import httpx
import pytest

from agentruns.models import Run, RunStatus
from agentruns.tokens import create_token
from approvals.models import Approval, ApprovalStatus
from tests.procs import start_web, start_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TWO_PERSON = 10_000  # ORD-1001 (247.11) needs two approvers
ENV = {"REFUND_APPROVAL_THRESHOLD_CENTS": 0, "REFUND_TWO_PERSON_CENTS": TWO_PERSON}


def chunks_of(response: httpx.Response) -> list[dict]:
    out = []
    for line in response.iter_lines():
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
    return out


def test_a_decision_on_the_version_before_an_edit_refunds_nothing(seeded, tmp_path):
    from django.contrib.auth import get_user_model

    users = {u.username: u for u in get_user_model().objects.all()}
    web, url = start_web(tmp_path, **ENV)
    worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway", **ENV)
    try:

        def api(name: str) -> httpx.Client:
            token = create_token(users[name])
            return httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )

        def ledger() -> list[dict]:
            refunds = api("viewer").get("/gateway/refunds", params={"order_id": "ORD-1001"})
            return refunds.json()["refunds"]

        # approver's chat: the stream shows the proposal of 247.11 as approval "<id>"
        user_message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "broken"}]}
        chat = {"id": "T-1030", "messages": [user_message], "input": {"order_id": "ORD-1001"}}
        with api("approver").stream("POST", "/api/chat/refund", json=chat) as response:
            assert response.status_code == 200
            first = chunks_of(response)
        asked = next(c for c in first if c["type"] == "tool-approval-request")
        call = next(
            c
            for c in first
            if c["type"] == "tool-input-available" and c["toolCallId"] == asked["toolCallId"]
        )
        assert call["input"]["amount_cents"] == 24711
        approval = Approval.objects.get(run__thread_turn__thread_id="T-1030")
        assert asked["approvalId"] == str(approval.id) and approval.approvals_required == 2

        edit = api("approver2").post(
            f"/api/approvals/{approval.id}",
            json={
                "decision": "approve",
                "version": 1,
                "args": {"amount_cents": 100, "reason": "only the lid"},
            },
        )
        assert edit.status_code == 200 and edit.json()["version"] == 2, edit.text

        # lead decides on what he saw before the edit: the API, then a bulk selection
        stale = api("lead").post(
            f"/api/approvals/{approval.id}", json={"decision": "approve", "version": 1}
        )
        assert stale.status_code == 409
        assert stale.json()["approval"]["args"]["amount_cents"] == 100
        bulk = api("lead").post(
            "/api/approvals/bulk",
            json={"ids": [approval.id], "decision": "approve", "versions": {str(approval.id): 1}},
        )
        assert bulk.json()["results"][0]["code"] == "stale_version"
        # the chat answers the request it was shown (version 1): nothing is decided, and the
        # stream asks again with the current proposal under the new version's id
        answer = {
            **call,
            "type": f"tool-{call['toolName']}",
            "state": "approval-responded",
            "approval": {"id": asked["approvalId"], "approved": True},
        }
        answer.pop("toolName")
        messages = [user_message, {"id": "a1", "role": "assistant", "parts": [answer]}]
        with api("approver").stream(
            "POST", "/api/chat/refund", json={**chat, "messages": messages}
        ) as response:
            assert response.status_code == 200 and response.headers["x-decision-status"] == "409"
            again = chunks_of(response)
        reasked = [c for c in again if c["type"] == "tool-approval-request"]
        assert [c["approvalId"] for c in reasked] == [f"{approval.id}.2"]
        shown = [c for c in again if c["type"] == "tool-input-available"]
        assert shown[-1]["input"]["amount_cents"] == 100
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.PENDING and approval.approvals_given == 1
        assert Run.objects.get(id=approval.run_id).status == RunStatus.WAITING
        assert ledger() == []

        current = api("lead").post(
            f"/api/approvals/{approval.id}", json={"decision": "approve", "version": 2}
        )
        assert current.status_code == 200 and current.json()["status"] == "approved"
        done = wait_until(
            lambda: (r := Run.objects.get(id=approval.run_id)).is_terminal and r,
            timeout=120,
            message="the run to finish",
        )
        assert done.status == RunStatus.SUCCEEDED, done.error
        assert [r["amount_cents"] for r in ledger()] == [100]
    finally:
        worker.stop()
        web.stop()
