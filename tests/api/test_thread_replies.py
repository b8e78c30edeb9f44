"""A run that waits for its thread's next message (issue 33, `waiting_for` kind `message`): the
agent asks the customer within its turn (`ask_customer` of `wait_tools()`), the next message
posted to the thread answers it instead of starting a run, and the run goes on with the reply.

In-process on the real PostgreSQL: runs are executed by the slice runner (`advance`); the agent
`pa-ask-customer` (tests/thread_agents.py) asks "Which order do you mean?" when the prompt begins
with "ask" and says the reply back.
"""

from __future__ import annotations

import pytest
from pydantic_ai.messages import ToolReturnPart

from agentruns.models import Run, RunStatus, Thread, Wait, WaitKind, WaitStatus
from agentruns.registry import wait_for_event
from tests import thread_agents
from tests.api.test_threads import post, run_of
from tests.helpers import ApiClient, advance, assert_json_error, make_user, steps
from tests.pydantic_ai.kit import start
from tests.runtime import wait_agents  # noqa: F401  (registers pa-waits, whose model asks)

pytestmark = pytest.mark.django_db

AGENT = "pa-ask-customer"
QUESTION = "Which order do you mean?"


@pytest.fixture
def talker(django_user_model):
    user = make_user(django_user_model, "talker", ["agentruns.start_run", "agentruns.view_run"])
    return ApiClient(user)


def said(api: ApiClient, thread: str) -> list[tuple[str, str, bool]]:
    messages = api.get(f"/api/threads/{thread}").json()["messages"]
    return [(m["author"], m["text"], m["entered"]) for m in messages]


def test_the_next_message_answers_the_run_waiting_for_it(talker):
    asking = run_of(post(talker, "t-ask", "ask me something", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    waiting = talker.get(f"/api/runs/{asking.id}").json()["waiting_for"]
    assert waiting["kind"] == "message" and waiting["token"] is None
    listed = talker.get("/api/runs?waiting_for=message").json()["runs"]
    assert [r["id"] for r in listed] == [str(asking.id)]
    # the question shows in the thread while the run waits (its run stores it when it ends)
    assert said(talker, "t-ask") == [
        ("customer", "ask me something", True),
        ("agent", QUESTION, False),
    ]

    replied = post(talker, "t-ask", "ORD-2, the blender", id="m-2")
    assert replied.status_code == 202, replied.content[:300]
    body = replied.json()
    assert body["run_id"] == str(asking.id)  # no run of its own: the waiting one resumes
    assert body["message"]["text"] == "ORD-2, the blender"
    assert body["message"]["author"] == "customer" and body["message"]["sender"] == "talker"
    assert body["run"]["status"] == "queued"
    assert Run.objects.filter(thread_id="t-ask").count() == 1
    # the same message id again is the same answer (nothing resolved twice, no run started)
    again = post(talker, "t-ask", "ORD-2, the blender", id="m-2")
    assert again.status_code == 202 and again.json()["run_id"] == str(asking.id)
    assert Wait.objects.filter(run=asking, status=WaitStatus.RESOLVED).count() == 1
    assert Run.objects.filter(thread_id="t-ask").count() == 1

    assert advance(asking).status == RunStatus.SUCCEEDED
    asking.refresh_from_db()
    assert asking.output == "got: ORD-2, the blender from customer"
    # repeated once its run has stored it: the same run, the message as the history has it
    stored = post(talker, "t-ask", "ORD-2, the blender", id="m-2")
    assert stored.status_code == 202 and stored.json()["run_id"] == str(asking.id)
    assert stored.json()["message"]["text"] == "ORD-2, the blender"
    assert stored.json()["message"]["entered"] is True
    assert said(talker, "t-ask") == [
        ("customer", "ask me something", True),
        ("agent", QUESTION, True),
        ("customer", "ORD-2, the blender", True),
        ("agent", asking.output, True),
    ]

    # the next message is a turn of its own, and its model reads the question and the reply
    later = run_of(post(talker, "t-ask", "thanks"))
    assert later.id != asking.id
    thread_agents.GIVEN.clear()
    assert advance(later).status == RunStatus.SUCCEEDED
    returns = [p for m in thread_agents.GIVEN[0] for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_name, r.content) for r in returns] == [
        ("ask_customer", {"reply": "ORD-2, the blender", "from": "customer"})
    ]


def test_a_colleagues_message_answers_it_as_staff(talker):
    asking = run_of(post(talker, "t-ask-s", "ask away", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    run_of(post(talker, "t-ask-s", "It is ORD-9 (from the call log)", **{"from": "staff"}))
    assert advance(asking).output == "got: It is ORD-9 (from the call log) from staff"
    assert said(talker, "t-ask-s")[2] == ("staff", "It is ORD-9 (from the call log)", True)


def test_an_interrupt_cancels_the_waiting_run_and_starts_a_turn(talker):
    asking = run_of(post(talker, "t-ask-i", "ask me", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    turn = run_of(post(talker, "t-ask-i", "never mind", multitask="interrupt"))
    asking.refresh_from_db()
    assert asking.status == RunStatus.CANCELLED and turn.id != asking.id
    assert advance(turn).output == "heard: ask me | never mind"
    # the cancelled run's wait holds nothing: a later question of the thread waits again
    again = run_of(post(talker, "t-ask-i", "ask again"))
    assert advance(again).status == RunStatus.WAITING
    assert run_of(post(talker, "t-ask-i", "ORD-3")).id == again.id
    assert advance(again).output == "got: ORD-3 from customer"


def test_a_cancelled_asking_run_leaves_the_next_message_a_turn_of_its_own(talker, lead):
    asking = run_of(post(talker, "t-ask-x", "ask me", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    assert ApiClient(lead).post(f"/api/runs/{asking.id}/cancel", {}).status_code == 200
    turn = run_of(post(talker, "t-ask-x", "ORD-4"))
    assert turn.id != asking.id
    assert Wait.objects.get(run=asking).status != WaitStatus.RESOLVED  # it answered nothing
    assert advance(turn).output == "heard: ask me | ORD-4"


def test_a_reply_taken_by_a_run_stopped_before_it_resumed_reaches_the_next_turn(talker):
    asking = run_of(post(talker, "t-ask-stop", "ask me", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    assert run_of(post(talker, "t-ask-stop", "ORD-2, the blender")).id == asking.id  # queued
    stopped = talker.post(f"/api/runs/{asking.id}/stop", {})
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
    later = run_of(post(talker, "t-ask-stop", "hello?"))
    thread_agents.GIVEN.clear()
    assert advance(later).status == RunStatus.SUCCEEDED
    returns = [p for m in thread_agents.GIVEN[0] for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(r.tool_name, r.content) for r in returns] == [
        ("ask_customer", {"reply": "ORD-2, the blender", "from": "customer"})
    ]
    assert ("customer", "ORD-2, the blender", True) in said(talker, "t-ask-stop")


def test_a_run_of_no_thread_is_told_to_ask_a_colleague():
    run = advance(start("pa-waits", ("ask_customer", {"question": "Which order?"})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert not Wait.objects.filter(run=run, kind=WaitKind.MESSAGE).exists()
    (call,) = steps(run, "tool")
    assert "no conversation's turn" in str(call.result)


def test_a_chat_asks_in_its_answer_instead(talker):
    asking = run_of(post(talker, "t-ask-c", "ask in a chat", agent=AGENT))
    Thread.objects.filter(id="t-ask-c").update(chat=True)  # as the chat endpoint makes them
    assert advance(asking).status == RunStatus.SUCCEEDED
    assert asking.output.startswith("told: in a chat the customer's reply is")
    assert not Wait.objects.filter(run=asking, kind=WaitKind.MESSAGE).exists()


def test_hooks_and_event_waits_cannot_take_a_threads_message_token(talker, django_user_model):
    asking = run_of(post(talker, "t-ask-h", "ask me", agent=AGENT))
    assert advance(asking).status == RunStatus.WAITING
    hooker = ApiClient(make_user(django_user_model, "carrier", ["agentruns.resolve_hook"]))
    assert_json_error(hooker.post("/api/hooks/message:t-ask-h", {"text": "ORD-1"}), 404)
    assert Wait.objects.get(run=asking).status == WaitStatus.PENDING
    with pytest.raises(ValueError, match="message:"):
        wait_for_event("message:t-ask-h")
