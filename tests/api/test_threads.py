"""Conversations (issue 33): a thread of runs, one run per message, each given the whole history.

In-process: runs are executed by the slice runner (`advance`) on the real PostgreSQL; the agent
(tests/thread_agents.py) answers with every prompt it was given, so each answer says which
history its run had.
"""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Thread, ThreadMessage, ThreadTurn
from tests import thread_agents
from tests.helpers import ApiClient, advance, assert_json_error, make_user

pytestmark = pytest.mark.django_db

AGENT = "pa-talk"


def post(api: ApiClient, thread: str, text: str, **body):
    return api.post(f"/api/threads/{thread}/messages", {"text": text, **body})


def run_of(response) -> Run:
    assert response.status_code in (200, 201), response.content[:500]
    return Run.objects.get(id=response.json()["run_id"])


@pytest.fixture
def talker(django_user_model):
    user = make_user(django_user_model, "talker", ["agentruns.start_run", "agentruns.view_run"])
    return ApiClient(user)


def test_three_turns_with_an_interrupt(talker, approver):
    first = run_of(post(talker, "t-1", "hello there", agent=AGENT))
    assert advance(first).status == RunStatus.SUCCEEDED
    assert first.output == "heard: hello there"

    # the second turn parks for a person (a refund above 100 cents)
    second = run_of(post(talker, "t-1", "refund 500 please"))
    assert second.concurrency_key == "thread:t-1"
    assert advance(second).status == RunStatus.WAITING

    # the customer changes their mind: the parked run is cancelled, the new message answered
    third = run_of(post(talker, "t-1", "no, only lookup", multitask="interrupt"))
    second.refresh_from_db()
    assert second.status == RunStatus.CANCELLED
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
