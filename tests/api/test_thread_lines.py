"""A thread's runs take turns, and each takes its agent's concurrency key as any run does
(issues 33 and 30): a chat about an order is in the order's line with every other run about it.

In-process on the real PostgreSQL: the runs are executed by the slice runner (`advance`); the
agent `pa-talk-order` (tests/thread_agents.py) keys its runs by the input's order id.
"""

from __future__ import annotations

import pytest

from agentruns import services
from agentruns.models import ConcurrencyKey, Run, RunStatus
from approvals.models import Approval
from tests import thread_agents
from tests.api.test_threads import post, run_of
from tests.helpers import ApiClient, advance, make_user

pytestmark = pytest.mark.django_db

AGENT = "pa-talk-order"


@pytest.fixture
def talker(django_user_model):
    user = make_user(django_user_model, "talker", ["agentruns.start_run", "agentruns.view_run"])
    return ApiClient(user)


def refresh(*runs: Run) -> None:
    for run in runs:
        run.refresh_from_db()


def start_chat(api: ApiClient, thread: str, text: str, order: str) -> Run:
    response = api.post(
        "/api/runs",
        {"agent": AGENT, "input": {"message": text, "order_id": order}, "thread": thread},
    )
    assert response.status_code == 201, response.content
    return Run.objects.get(id=response.json()["id"])


def test_a_chat_waits_in_its_orders_line_behind_a_run_parked_for_a_person(talker, approver):
    thread_agents.CALLS.clear()
    # a run about order O-7, outside any chat, parks for a refund approval: it holds the order
    other = services.start_run(AGENT, {"message": "refund 900", "order_id": "O-7"}).run
    assert advance(other).status == RunStatus.WAITING and other.holds_key

    chat = start_chat(talker, "t-o7", "refund 300 please", "O-7")
    assert chat.thread_id == "t-o7" and chat.concurrency_key == "O-7"
    assert chat.waiting_behind == other.id and not chat.holds_key  # the order's line
    # the chat's next message waits in the thread's line behind its turn before, with no key yet
    later = run_of(post(talker, "t-o7", "and when does it arrive?"))
    assert later.waiting_behind == chat.id and later.concurrency_key is None
    page = talker.get(f"/api/runs/{later.id}").json()
    assert page["waiting_behind"] == str(chat.id)

    # the parked run is approved and refunds: only then does the chat's turn begin
    approval = Approval.objects.get(run=other, status="pending")
    assert ApiClient(approver).post(f"/api/approvals/{approval.id}", {"decision": "approve"})
    assert advance(other).status == RunStatus.SUCCEEDED
    refresh(chat, later)
    assert chat.holds_key and chat.waiting_behind is None
    assert later.waiting_behind == chat.id  # still the thread's: one turn at a time
    assert advance(chat).status == RunStatus.WAITING  # its own refund waits for a person

    # the chat's refund parks its run: the thread's next turn goes, into the order's line
    # behind the parked refund (which keeps the order)
    refresh(later)
    assert later.waiting_behind == chat.id and later.concurrency_key == "O-7"
    assert not later.holds_key
    started = services.start_run(AGENT, {"message": "lookup", "order_id": "O-7"}).run
    assert started.waiting_behind == later.id  # the order's line: a third door, the same line

    approval = Approval.objects.get(run=chat, status="pending")
    assert ApiClient(approver).post(f"/api/approvals/{approval.id}", {"decision": "approve"})
    assert advance(chat).status == RunStatus.SUCCEEDED
    refresh(later, started)
    # the chat's end gave the order to `later`, ahead of the run started after it
    assert later.concurrency_key == "O-7" and later.holds_key and later.waiting_behind is None
    assert started.waiting_behind == later.id
    assert advance(later).output.startswith("heard: refund 300 please")
    refresh(started)
    assert started.holds_key
    assert advance(started).status == RunStatus.SUCCEEDED
    assert thread_agents.CALLS == [
        ("talk_refund", {"amount_cents": 900}),
        ("talk_refund", {"amount_cents": 300}),
        ("talk_lookup", {}),
    ]
    assert not ConcurrencyKey.objects.filter(agent=AGENT, key="O-7").exists()  # all let go


def test_a_cancelled_turn_in_the_line_hands_its_place_on(talker, lead):
    first = start_chat(talker, "t-c", "one", "O-8")
    second = run_of(post(talker, "t-c", "two"))
    third = run_of(post(talker, "t-c", "three"))
    assert (second.waiting_behind, third.waiting_behind) == (first.id, second.id)
    assert ApiClient(lead).post(f"/api/runs/{second.id}/cancel", {}).status_code == 200
    refresh(second, third)
    assert second.status == RunStatus.CANCELLED and second.waiting_behind is None
    assert third.waiting_behind == first.id and third.concurrency_key is None
    assert advance(first).status == RunStatus.SUCCEEDED
    refresh(third)
    assert third.holds_key and third.concurrency_key == "O-8"
    # the cancelled turn's message stays in the history; its run never answered
    assert advance(third).output == "heard: one | two | three"


def test_an_interrupt_stops_the_active_turn_and_keeps_the_line(talker):
    first = start_chat(talker, "t-i", "refund 500", "O-9")
    assert advance(first).status == RunStatus.WAITING
    second = run_of(post(talker, "t-i", "two"))
    third = run_of(post(talker, "t-i", "actually, a lookup only", multitask="interrupt"))
    refresh(first, second, third)
    assert first.status == RunStatus.CANCELLED
    assert not Approval.objects.filter(run=first, status="pending").exists()
    # the waiting turn took its place (it holds the order now); the interrupting one follows it
    assert second.holds_key and second.waiting_behind is None
    assert third.waiting_behind == second.id and third.concurrency_key is None
    assert advance(second).status == RunStatus.SUCCEEDED
    refresh(third)
    assert third.holds_key
    assert advance(third).output.startswith("done: order_lookup=")
