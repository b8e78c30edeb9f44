"""A thread's parked turn lets the next one go, with real processes (issue 33: `enqueue` starts
the next run when the active one ends or parks): daphne serving the threads and approvals API,
a `qcluster` worker on PostgreSQL whose model is the fake OpenAI server's real socket.

The first turn's payment needs a person (`t_pay` above 100) and parks; the customer's next
message is answered meanwhile by its own run in the worker; the payment is approved later, the
parked run resumes beside the turns after it and pays once, and the fourth turn's request to
the model server carries the whole conversation, the parked run's call and answer included.
"""

from __future__ import annotations

import httpx
import pytest

from agentruns.models import Run, RunStatus
from agentruns.tokens import create_token
from approvals.models import Approval
from scripts.fake_openai_server import FakeOpenAI, Reply
from tests.conftest import make_user
from tests.procs import wait_until
from tests.providers.kit import API_KEY
from tests.stream.kit import served_by_fake_openai
from tests.stream.test_thread_interrupt_live import ended

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(300)]

THREAD = "live-park"


def post(client: httpx.Client, text: str, **body: object) -> Run:
    response = client.post(f"/api/threads/{THREAD}/messages", json={"text": text, **body})
    assert response.status_code == 202, response.text
    return Run.objects.get(id=response.json()["run_id"])


def parked(run: Run) -> Run:
    return wait_until(
        lambda: Run.objects.filter(id=run.id, status=RunStatus.WAITING).first(),
        timeout=60,
        interval=0.02,
        message=f"run {run.id} to park",
    )


def test_the_next_turn_goes_while_a_payment_waits_for_approval(tmp_path, django_user_model):
    customer = make_user(
        django_user_model, "customer", ["agentruns.view_run", "agentruns.start_run"]
    )
    approver = make_user(
        django_user_model,
        "approver",
        ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
    )
    as_customer = {"Authorization": f"Bearer {create_token(customer)}"}
    as_approver = {"Authorization": f"Bearer {create_token(approver)}"}
    with (
        FakeOpenAI(mode="error", api_key=API_KEY) as fake,
        served_by_fake_openai(tmp_path, fake.url) as url,
        httpx.Client(base_url=url, headers=as_customer, timeout=30) as client,
    ):
        fake.script(Reply(tool_calls=[("t_pay", {"amount": 500})]))
        paying = parked(post(client, "Please pay me back 500", agent="script"))
        assert Approval.objects.filter(run=paying, status="pending").count() == 1

        fake.script(Reply(text="A colleague is looking at your payment now."))
        asking = post(client, "Is anybody there?")
        assert asking.waiting_behind is None  # not behind the parked turn
        assert ended(asking).status == "succeeded"
        assert Run.objects.get(id=paying.id).status == RunStatus.WAITING

        fake.script(Reply(text="Paid: 500."))
        item = Approval.objects.get(run=paying, status="pending")
        decided = client.post(
            f"/api/approvals/{item.id}", json={"decision": "approve"}, headers=as_approver
        )
        assert decided.status_code == 200, decided.text
        assert ended(paying).status == "succeeded"

        fake.script(Reply(text="You are welcome."))
        thanks = post(client, "Thanks!")
        assert ended(thanks).status == "succeeded"
        body = client.get(f"/api/threads/{THREAD}").json()

    assert [r["status"] for r in body["runs"]] == ["succeeded"] * 3
    paid = Run.objects.get(id=paying.id).steps.filter(kind="tool", tool="t_pay")
    assert [(s.status, s.attempts) for s in paid] == [("succeeded", 1)]  # paid once
    # the second turn's model read both messages and not the payment (not stored before it ended)
    requests = fake.chat_requests()
    assert len(requests) == 4  # no turn was asked twice
    second = [(m["role"], m.get("content")) for m in requests[1].messages if m["role"] != "system"]
    assert [r for r, _ in second] == ["user", "user"]
    # the fourth turn's: the whole conversation, the parked run's call, result and answer too
    fourth = requests[3].messages
    roles = [m["role"] for m in fourth if m["role"] != "system"]
    assert roles == ["user", "user", "assistant", "assistant", "tool", "assistant", "user"]
    calls = [c["function"]["name"] for m in fourth for c in m.get("tool_calls") or []]
    assert calls == ["t_pay"]
    assert fourth[-2]["content"] == "Paid: 500." and "Thanks!" in fourth[-1]["content"]
