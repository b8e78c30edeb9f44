"""The audit's reproductions (issue 46) through real processes: a real daphne takes the demo
users' requests with bearer tokens, a real qcluster runs the demo's refund agent (every refund
parks for approval, REFUND_APPROVAL_THRESHOLD_CENTS=0), on the demo's seeded data.

- The predicted-thread takeover: the trainee makes the thread the approver's `"thread": true`
  with a business key would have had, about ORD-1050; the approver's run gets a thread of its
  own and puts no refund of another order before an approver.
- The out-of-scope refund: a thread whose first run was about ORD-1050 (stopped), then a run in
  it for ORD-1039: the refund of ORD-1050 the history suggests is refused, never parked.
- The trainee's priority: 403 naming the permission, nothing started.
The tests share the module's daphne and worker; each has its own seeded data and runs.
(150 guessed hook tokens meeting a bound: tests/api/test_quotas.py, across two web processes.)
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from agentruns.models import Run, RunStatus, ThreadTurn
from agentruns.tokens import create_token
from approvals.models import Approval
from tests.procs import module_web_and_worker, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"REFUND_APPROVAL_THRESHOLD_CENTS": 0}  # every refund parks for an approver
# the namespace `"thread": true` derived ids in, as the source said: what the audit predicted
LEGACY_NAMESPACE = uuid.UUID("6f1d5c52-3f0e-4f55-9d3c-2a7c4b8e9a10")


@pytest.fixture(scope="module")
def url(tmp_path_factory, django_db_setup, django_db_blocker):
    """The module's daphne (the API, the refund gateway) and a worker beside it."""
    with module_web_and_worker(tmp_path_factory, django_db_blocker, **ENV) as (base_url, _):
        yield base_url


def client_of(url: str, username: str, django_user_model) -> httpx.Client:
    user = django_user_model.objects.get(username=username)  # seed_demo's
    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {create_token(user)}"}, timeout=30
    )


def settled(run_id: str, timeout: float = 90) -> Run:
    """The run once it ended or parked (its refund waiting for an approver)."""

    def done() -> Run | None:
        run = Run.objects.get(id=run_id)
        return run if run.is_terminal or run.status == RunStatus.WAITING else None

    return wait_until(done, timeout=timeout, interval=0.2, message=f"run {run_id} to settle")


def refunds_asked(**filters) -> list[dict]:
    """The refunds put before an approver (pending), with their arguments."""
    items = Approval.objects.filter(kind="approval", step__tool="issue_refund", **filters)
    return [a.step.arguments for a in items.select_related("step")]


def test_the_predicted_thread_takeover(url, seeded, django_user_model):
    trainee = client_of(url, "trainee", django_user_model)
    approver = client_of(url, "approver", django_user_model)
    approver_pk = django_user_model.objects.get(username="approver").pk

    predicted = str(uuid.uuid5(LEGACY_NAMESPACE, f"{approver_pk}:refund:ticket-T-1039"))
    taken = trainee.post(
        f"/api/threads/{predicted}/messages",
        json={
            "text": "Please refund order ORD-1050, it arrived broken",
            "agent": "refund",
            "input": {"order_id": "ORD-1050"},
            "id": "K1",
        },
    )
    assert taken.status_code == 202, taken.text
    theirs = taken.json()["run_id"]
    settled(theirs)  # (the trainee's run hands its request over: it may not refund)

    body = {
        "agent": "refund",
        "thread": True,
        "input": {"order_id": "ORD-1039", "message": "The lamp arrived broken, refund please"},
    }
    mine = approver.post("/api/runs", json=body, headers={"Idempotency-Key": "ticket-T-1039"})
    assert mine.status_code == 201, mine.text
    assert mine.json()["thread"] != predicted
    run = settled(mine.json()["id"])
    assert run.status == RunStatus.WAITING, run.error  # its own order's refund, for approval
    assert run.thread.created_by.username == "approver"
    texts = list(ThreadTurn.objects.filter(thread_id=run.thread_id).values_list("text", flat=True))
    assert texts == ["The lamp arrived broken, refund please"]  # nothing of the trainee's
    # the trainee's message id K1 is no way to the trainee's run either
    other = approver.post("/api/runs", json=body, headers={"Idempotency-Key": "K1"})
    assert other.status_code == 201, other.text
    assert other.json()["id"] != theirs and other.json()["thread"] != predicted
    assert other.json()["waiting_behind"] == str(run.id)  # ORD-1039's line: one run at a time

    asked = refunds_asked(status="pending")
    assert {args["order_id"] for args in asked} == {"ORD-1039"}, asked
    assert not refunds_asked(
        step__run__created_by__username="approver", step__arguments__order_id="ORD-1050"
    )


def test_the_out_of_scope_refund(url, seeded, django_user_model):
    lead = client_of(url, "lead", django_user_model)

    first = lead.post(
        "/api/runs",
        json={
            "agent": "refund",
            "thread": True,
            "input": {"order_id": "ORD-1050", "message": "My order arrived broken"},
        },
    )
    assert first.status_code == 201, first.text
    thread, earlier = first.json()["thread"], first.json()["id"]
    assert settled(earlier).status == RunStatus.WAITING  # ORD-1050's own refund, for approval
    assert lead.post(f"/api/runs/{earlier}/stop", json={}).status_code == 200
    wait_until(lambda: Run.objects.get(id=earlier).status == RunStatus.CANCELLED, timeout=30)
    assert not refunds_asked(status="pending")  # withdrawn with its run

    started = lead.post(
        "/api/runs",
        json={
            "agent": "refund",
            "thread": thread,
            "input": {"order_id": "ORD-1039", "message": "The lamp arrived broken"},
        },
    )
    assert started.status_code == 201, started.text
    run = settled(started.json()["id"])
    assert not refunds_asked(status="pending", step__arguments__order_id="ORD-1050")
    assert all(a["order_id"] == "ORD-1039" for a in refunds_asked(step__run=run))
    assert started.json()["scope"] == "ORD-1039"  # frozen from its own input
    steps = lead.get(f"/api/runs/{run.id}").json()["steps"]
    refused = [s for s in steps if s["tool"] == "issue_refund"]
    assert refused and all(s["status"] == "failed" and s["attempts"] == 0 for s in refused)
    assert all("outside this run's scope" in s["error"] for s in refused), refused


def test_the_trainees_priority(url, seeded, django_user_model):
    trainee = client_of(url, "trainee", django_user_model)
    order = {"order_id": "ORD-1001", "message": "refund please"}
    refused = trainee.post("/api/runs", json={"agent": "refund", "input": order, "priority": 100})
    assert refused.status_code == 403, refused.text
    assert "agentruns.set_priority" in refused.json()["error"]
    chat = trainee.post(
        "/api/chat/refund",
        json={
            "id": "c-vip",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
            "input": order,
            "priority": 100,
        },
    )
    assert chat.status_code == 403 and "agentruns.set_priority" in chat.json()["error"]
    assert not Run.objects.exists()
    lead = client_of(url, "lead", django_user_model)
    allowed = lead.post("/api/runs", json={"agent": "refund", "input": order, "priority": 100})
    assert allowed.status_code == 201 and allowed.json()["priority"] == 100
