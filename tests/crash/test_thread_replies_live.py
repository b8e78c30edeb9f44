"""A question to the customer through real processes (issue 33, `waiting_for` kind `message`): a
real qcluster runs a thread's turn whose agent asks the customer (`ask_customer`) and parks; the
worker is SIGKILLed while the run waits and another one starts; the customer's reply, posted to
real daphne, answers the waiting run (no run of its own), which resumes in the new worker with
it exactly once and succeeds."""

from __future__ import annotations

import httpx
import pytest

from agentruns.models import Run, RunStatus, Wait, WaitStatus
from agentruns.tokens import create_token
from tests.conftest import make_user
from tests.procs import start_web, start_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]
ENV = {"AGENTRUNS_AGENT_MODULES": "tests.thread_agents"}
THREAD = "live-ask"


def _status(run_id) -> str:
    return Run.objects.get(id=run_id).status


def test_the_customers_reply_resumes_the_run_that_asked_across_a_worker_kill(
    tmp_path, procs, django_user_model
):
    customer = make_user(
        django_user_model, "customer", ["agentruns.view_run", "agentruns.start_run"]
    )
    web, url = start_web(tmp_path, **ENV)
    worker = start_worker(tmp_path, name="asks-1", **ENV)
    procs.extend([web, worker])
    api = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {create_token(customer)}"}, timeout=30
    )
    asked = api.post(
        f"/api/threads/{THREAD}/messages", json={"text": "ask me", "agent": "pa-ask-customer"}
    )
    assert asked.status_code == 202, asked.text
    run_id = asked.json()["run_id"]
    wait_until(lambda: _status(run_id) == RunStatus.WAITING, timeout=60, message="the question")
    assert api.get(f"/api/runs/{run_id}").json()["waiting_for"]["kind"] == "message"

    worker.kill()  # the waiting run holds nothing a worker keeps
    procs.append(start_worker(tmp_path, name="asks-2", **ENV))

    replied = api.post(f"/api/threads/{THREAD}/messages", json={"text": "ORD-2", "id": "c-9"})
    assert replied.status_code == 202, replied.text
    assert replied.json()["run_id"] == run_id  # the waiting run, not a new one
    again = api.post(f"/api/threads/{THREAD}/messages", json={"text": "ORD-2", "id": "c-9"})
    assert again.json()["run_id"] == run_id
    wait_until(lambda: _status(run_id) == RunStatus.SUCCEEDED, timeout=60, message="the answer")

    run = Run.objects.get(id=run_id)
    assert run.output == "got: ORD-2 from customer"
    assert Run.objects.filter(thread_id=THREAD).count() == 1
    assert [w.status for w in Wait.objects.filter(run_id=run_id)] == [WaitStatus.RESOLVED]
    said = [
        (m["author"], m["text"], m["entered"])
        for m in api.get(f"/api/threads/{THREAD}").json()["messages"]
    ]
    assert said == [
        ("customer", "ask me", True),
        ("agent", "Which order do you mean?", True),
        ("customer", "ORD-2", True),
        ("agent", "got: ORD-2 from customer", True),
    ]
