"""Conversations (issue 33): a thread of runs, one run per message, each given the whole history.

In-process: runs are executed by the slice runner (`advance`) on the real PostgreSQL; the agent
(tests/thread_agents.py) answers with every prompt it was given, so each answer says which
history its run had.
"""

from __future__ import annotations

import pytest
from pydantic_ai.messages import ToolCallPart, ToolReturnPart

from agentruns.models import Run, RunStatus, Thread, ThreadMessage, ThreadTurn
from approvals.models import Approval
from tests import thread_agents
from tests.helpers import ApiClient, advance, assert_json_error, make_user

pytestmark = pytest.mark.django_db

AGENT = "pa-talk"


def post(api: ApiClient, thread: str, text: str, **body):
    return api.post(f"/api/threads/{thread}/messages", {"text": text, **body})


def run_of(response) -> Run:
    assert response.status_code == 202, response.content[:500]
    body = response.json()  # DESIGN 6: 202 {"run": {...}, "message": {...}}
    assert body["run"]["id"] == body["run_id"] and body["message"]["run_id"] == body["run_id"]
    return Run.objects.get(id=body["run_id"])


@pytest.fixture
def talker(django_user_model):
    user = make_user(django_user_model, "talker", ["agentruns.start_run", "agentruns.view_run"])
    return ApiClient(user)


def test_three_turns_with_an_interrupt(talker, approver):
    thread_agents.CALLS.clear()  # the calls this process's earlier tests made
    first = run_of(post(talker, "t-1", "hello there", agent=AGENT))
    assert advance(first).status == RunStatus.SUCCEEDED
    assert first.output == "heard: hello there"

    # the second turn parks for a person (a refund above 100 cents)
    second = run_of(post(talker, "t-1", "refund 500 please"))
    assert second.thread_id == "t-1" and second.waiting_behind is None
    assert advance(second).status == RunStatus.WAITING
    assert Approval.objects.filter(run=second, status="pending").count() == 1

    # the customer changes their mind: the parked run is cancelled, the new message answered
    third = run_of(post(talker, "t-1", "no, only lookup", multitask="interrupt"))
    second.refresh_from_db()
    assert second.status == RunStatus.CANCELLED
    assert not Approval.objects.filter(run=second, status="pending").exists()  # withdrawn
    assert advance(third).status == RunStatus.SUCCEEDED
    assert third.output.startswith("done: talk_lookup=")
    assert [c[0] for c in thread_agents.CALLS] == ["talk_lookup"]  # no refund ran

    # a fourth message: the history has every message, in order, each once
    fourth = run_of(post(talker, "t-1", "thanks"))
    assert advance(fourth).output == (
        "heard: hello there | refund 500 please | no, only lookup | thanks"
    )
    body = talker.get("/api/threads/t-1").json()
    said = [(m["author"], m["text"]) for m in body["messages"]]
    assert said == [
        ("customer", "hello there"),
        ("agent", "heard: hello there"),
        ("customer", "refund 500 please"),
        ("customer", "no, only lookup"),
        ("agent", "(calls talk_lookup)"),
        ("agent", third.output),
        ("customer", "thanks"),
        ("agent", fourth.output),
    ]
    assert [r["id"] for r in body["runs"]] == [str(r.id) for r in (first, second, third, fourth)]
    assert [r["status"] for r in body["runs"]] == [
        "succeeded",
        "cancelled",
        "succeeded",
        "succeeded",
    ]
    assert all(m["entered"] for m in body["messages"])
    # stored once each: the thread's rows are exactly its chain
    # (the third run stored its call, the tool's return and its answer: 9 rows)
    assert ThreadMessage.objects.filter(thread_id="t-1").count() == 9


def test_an_interrupted_runs_completed_tool_steps_reach_the_next_turns_model(talker, approver):
    second = run_of(post(talker, "t-done", "lookup then refund 500", agent=AGENT))
    assert advance(second).status == RunStatus.WAITING  # looked up; the refund waits for a person
    third = run_of(post(talker, "t-done", "no refund after all", multitask="interrupt"))
    second.refresh_from_db()
    assert second.status == RunStatus.CANCELLED
    thread_agents.GIVEN.clear()
    assert advance(third).status == RunStatus.SUCCEEDED
    given = thread_agents.GIVEN[0]  # what the next turn's model read: the lookup happened
    returns = [p for m in given for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_name, r.content) for r in returns] == [
        ("talk_lookup", {"order": "ORD-1", "status": "delivered"})
    ]
    calls = [p.tool_name for m in given for p in m.parts if isinstance(p, ToolCallPart)]
    assert calls == ["talk_lookup"]  # the refund that never ran is not in its history
    assert thread_agents.prompts(given) == ["lookup then refund 500", "no refund after all"]
    said = [(m["author"], m["text"]) for m in talker.get("/api/threads/t-done").json()["messages"]]
    assert said[:3] == [
        ("customer", "lookup then refund 500"),
        ("agent", "(calls talk_lookup)"),
        ("customer", "no refund after all"),
    ]


def test_enqueue_waits_behind_the_active_run_and_gets_its_answer(talker):
    first = run_of(post(talker, "t-q", "one", agent=AGENT))
    second = run_of(post(talker, "t-q", "two"))  # enqueue is the default
    assert second.waiting_behind == first.id and not second.holds_key
    waiting = talker.get("/api/threads/t-q").json()["messages"]
    # a message enters the history when its run first executes (its first slice)
    assert [(m["text"], m["entered"]) for m in waiting] == [("one", False), ("two", False)]
    assert advance(first).status == RunStatus.SUCCEEDED
    waiting = talker.get("/api/threads/t-q").json()["messages"]
    assert [(m["text"], m["entered"]) for m in waiting] == [
        ("one", True),
        ("heard: one", True),
        ("two", False),
    ]
    second.refresh_from_db()
    # its turn came when the first ended (its agent declares no key: it is due at once)
    assert second.waiting_behind is None and second.enqueued_at is not None
    assert advance(second).output == "heard: one | two"
    runs = talker.get("/api/threads/t-q").json()["runs"]
    assert [r["status"] for r in runs] == ["succeeded", "succeeded"]


def test_a_parked_run_lets_the_next_turn_go_and_resumes_beside_it(talker, approver):
    thread_agents.CALLS.clear()
    parked = run_of(post(talker, "t-p", "refund 900", agent=AGENT))
    assert advance(parked).status == RunStatus.WAITING  # the refund waits for a person
    # the conversation goes on meanwhile: the next message's run starts at once
    later = run_of(post(talker, "t-p", "and when does it arrive?"))
    assert later.waiting_behind is None and later.enqueued_at is not None
    assert advance(later).output == "heard: refund 900 | and when does it arrive?"
    # every run of the thread parked or ended: even `reject` takes a message
    asked = run_of(post(talker, "t-p", "are you there?", multitask="reject"))
    assert asked.waiting_behind is None
    assert advance(asked).status == RunStatus.SUCCEEDED

    # the refund is approved: the parked run resumes beside the turns after it, from its own
    # history, and its answer is appended to the thread when it ends
    approval = Approval.objects.get(run=parked, status="pending")
    decided = ApiClient(approver).post(f"/api/approvals/{approval.id}", {"decision": "approve"})
    assert decided.status_code == 200, decided.content[:300]
    thread_agents.GIVEN.clear()
    assert advance(parked).status == RunStatus.SUCCEEDED
    assert thread_agents.prompts(thread_agents.GIVEN[0]) == ["refund 900"]
    assert thread_agents.CALLS == [("talk_refund", {"amount_cents": 900})]  # once

    thanks = run_of(post(talker, "t-p", "thanks"))
    thread_agents.GIVEN.clear()
    assert advance(thanks).status == RunStatus.SUCCEEDED
    returns = [p for m in thread_agents.GIVEN[0] for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_name, r.content) for r in returns] == [("talk_refund", {"refunded": 900})]
    said = [(m["author"], m["text"]) for m in talker.get("/api/threads/t-p").json()["messages"]]
    assert said == [
        ("customer", "refund 900"),
        ("customer", "and when does it arrive?"),
        ("agent", later.output),
        ("customer", "are you there?"),
        ("agent", asked.output),
        ("agent", "(calls talk_refund)"),
        ("agent", parked.output),
        ("customer", "thanks"),
        ("agent", thanks.output),
    ]


def test_a_message_waits_behind_the_turn_that_passed_a_parked_run(talker):
    parked = run_of(post(talker, "t-pp", "refund 900", agent=AGENT))
    assert advance(parked).status == RunStatus.WAITING
    passing = run_of(post(talker, "t-pp", "one"))
    behind = run_of(post(talker, "t-pp", "two"))  # one run holds the thread's turn at a time
    assert passing.waiting_behind is None and behind.waiting_behind == passing.id
    assert assert_json_error(post(talker, "t-pp", "three", multitask="reject"), 409)[
        "run_id"
    ] == str(passing.id)
    assert advance(passing).status == RunStatus.SUCCEEDED
    behind.refresh_from_db()
    assert behind.waiting_behind is None and behind.enqueued_at is not None


def test_a_run_queued_behind_one_that_parks_takes_its_turn_in_the_commit_that_parks_it(talker):
    first = run_of(post(talker, "t-pq", "refund 900", agent=AGENT))
    second = run_of(post(talker, "t-pq", "and when?"))
    third = run_of(post(talker, "t-pq", "hello?"))
    assert (second.waiting_behind, third.waiting_behind) == (first.id, second.id)
    assert advance(first).status == RunStatus.WAITING
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.waiting_behind is None and second.enqueued_at is not None
    assert third.waiting_behind == second.id  # still one turn at a time behind it
    assert advance(second).output == "heard: refund 900 | and when?"


def test_reject_is_a_409_and_stores_nothing(talker):
    first = run_of(post(talker, "t-r", "one", agent=AGENT))
    body = assert_json_error(post(talker, "t-r", "two", multitask="reject"), 409)
    assert body["run_id"] == str(first.id)
    assert ThreadTurn.objects.filter(thread_id="t-r").count() == 1
    assert Run.objects.count() == 1
    advance(first)
    second = run_of(post(talker, "t-r", "two", multitask="reject"))  # idle now: taken
    assert advance(second).output == "heard: one | two"


def test_a_repeated_message_id_is_one_turn(talker):
    created = post(talker, "t-id", "hi", agent=AGENT, id="m-1")
    again = post(talker, "t-id", "hi", id="m-1")
    assert created.status_code == again.status_code == 202
    assert again.json()["run_id"] == created.json()["run_id"]
    assert ThreadTurn.objects.filter(thread_id="t-id").count() == 1


def test_a_thread_started_by_post_runs_keeps_its_input(talker):
    response = talker.post(
        "/api/runs",
        {"agent": AGENT, "input": {"message": "first", "order_id": "ORD-9"}, "thread": "t-api"},
    )
    assert response.status_code == 201, response.content
    assert response.json()["thread"] == "t-api"
    first = Run.objects.get(id=response.json()["id"])
    advance(first)
    second = run_of(post(talker, "t-api", "second"))
    assert second.input == {"message": "second", "order_id": "ORD-9"}
    assert advance(second).output == "heard: first | second"
    ours = talker.post("/api/runs", {"agent": AGENT, "input": {"message": "x"}, "thread": True})
    assert ours.status_code == 201 and Thread.objects.filter(id=ours.json()["thread"]).exists()


def test_staff_messages_are_staff(talker, lead):
    run_of(post(talker, "t-s", "hello", agent=AGENT))
    staff = run_of(post(ApiClient(lead), "t-s", "a colleague here", **{"from": "staff"}))
    advance(Run.objects.filter(thread_turn__thread_id="t-s").order_by("created_at").first())
    advance(staff)
    said = [(m["author"], m["sender"]) for m in talker.get("/api/threads/t-s").json()["messages"]]
    assert said[2] == ("staff", lead.username)
    assert said[0] == ("customer", "talker")


def test_permissions(django_user_model, talker):
    run_of(post(talker, "t-perm", "hello", agent=AGENT))
    viewer = ApiClient(make_user(django_user_model, "v", ["agentruns.view_run"]))
    nobody = ApiClient(make_user(django_user_model, "n", []))
    assert_json_error(post(viewer, "t-perm", "more"), 403)
    assert viewer.get("/api/threads/t-perm").status_code == 200
    assert_json_error(nobody.get("/api/threads/t-perm"), 403)
    assert_json_error(post(nobody, "t-new", "hi", agent=AGENT), 403)
    assert ThreadTurn.objects.count() == 1 and not Thread.objects.filter(id="t-new").exists()


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("t-bad", {"text": ""}, 400),
        ("t-bad", {"text": "x" * 5001, "agent": AGENT}, 400),
        ("t-bad", {"text": "hi", "agent": AGENT, "multitask": "rollback"}, 400),
        ("t-bad", {"text": "hi", "agent": AGENT, "from": "agent"}, 400),
        ("t-bad", {"text": 5, "agent": AGENT}, 400),
        ("t-bad", {"agent": AGENT}, 400),
        ("t-bad", {"text": "hi", "agent": AGENT, "surprise": 1}, 400),
        ("t-bad", {"text": "hi"}, 404),  # a new thread's first message names its agent
        ("t-bad", {"text": "hi", "agent": "no-such-agent"}, 404),
        ("..", {"text": "hi", "agent": AGENT}, 404),
        ("x" * 129, {"text": "hi", "agent": AGENT}, 404),
    ],
)
def test_bad_input_is_a_json_4xx_and_stores_nothing(talker, path, body, status):
    assert_json_error(talker.post(f"/api/threads/{path}/messages", body), status)
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_another_agents_thread_and_unknown_threads(talker):
    run_of(post(talker, "t-a", "hi", agent=AGENT))
    assert_json_error(post(talker, "t-a", "hi", agent="pa-shop"), 409)
    assert_json_error(talker.get("/api/threads/no-such"), 404)
    raw = talker.post("/api/threads/t-a/messages", raw="{not json")
    assert_json_error(raw, 400)
    assert_json_error(talker.post("/api/runs", {"agent": AGENT, "input": {}, "thread": "t-b"}), 400)
    assert_json_error(
        talker.post("/api/runs", {"agent": AGENT, "input": {"message": "m"}, "thread": "a/b"}),
        400,
    )
