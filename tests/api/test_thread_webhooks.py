"""What a conversation says to the outside world: `thread.answered` when the agent answers a
message of a thread, `thread.asked` when it asks the thread's customer and waits (issue 33), so
a system that relays the conversation (mail, a helpdesk) tells the customer without polling.

In-process on the real PostgreSQL: runs are executed by the slice runner (`advance`); what is
checked is the outbox (`WebhookDelivery` rows, the bytes the delivery loop signs and sends).
"""

from __future__ import annotations

import json

import pytest

from agentruns.models import RunStatus
from agentruns.runtime.conversations import history
from approvals.models import WebhookDelivery, WebhookEndpoint
from tests.api.test_thread_replies import AGENT as ASKER
from tests.api.test_thread_replies import QUESTION
from tests.api.test_threads import AGENT, post, run_of
from tests.helpers import ApiClient, advance, make_user

pytestmark = pytest.mark.django_db

SECRET = "whsec_" + "A" * 32


@pytest.fixture
def talker(django_user_model):
    user = make_user(django_user_model, "talker", ["agentruns.start_run", "agentruns.view_run"])
    return ApiClient(user)


@pytest.fixture
def endpoint():
    return WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", secret=SECRET)


def sent(event_type: str) -> list[dict]:
    rows = WebhookDelivery.objects.filter(event_type=event_type).order_by("id")
    return [json.loads(row.body) for row in rows]


def agent_messages(api: ApiClient, thread: str) -> list[dict]:
    messages = api.get(f"/api/threads/{thread}").json()["messages"]
    return [m for m in messages if m["author"] == "agent"]


def test_each_answer_is_announced_once_with_the_threads_own_message_id(talker, endpoint):
    first = run_of(post(talker, "t-wh", "hello there", agent=AGENT))
    assert advance(first).status == RunStatus.SUCCEEDED
    [event] = sent("thread.answered")
    data = event["data"]
    assert data["thread"]["id"] == "t-wh"
    assert data["run"]["id"] == str(first.id)
    message = data["thread"]["message"]
    assert (message["author"], message["text"]) == ("agent", "heard: hello there")
    # the id the thread itself gives the answer: a receiver can match it with GET /api/threads
    assert message["id"] == agent_messages(talker, "t-wh")[-1]["id"]
    assert message["created_at"]

    # a replay of the run's end (a slice that died after storing the answer) stores and
    # announces nothing again
    history.record_messages(first.id, "t-wh", [], answer=True)
    assert len(sent("thread.answered")) == 1

    second = run_of(post(talker, "t-wh", "thanks"))
    assert advance(second).status == RunStatus.SUCCEEDED
    answers = [e["data"]["thread"]["message"]["text"] for e in sent("thread.answered")]
    assert answers == ["heard: hello there", "heard: hello there | thanks"]
    assert len({e["data"]["thread"]["message"]["id"] for e in sent("thread.answered")}) == 2


def test_a_question_to_the_customer_is_announced_when_the_run_parks(talker, endpoint):
    asking = run_of(post(talker, "t-wh-ask", "ask me something", agent=ASKER))
    assert advance(asking).status == RunStatus.WAITING
    [event] = sent("thread.asked")
    message = event["data"]["thread"]["message"]
    assert message["text"] == QUESTION and message["author"] == "agent"
    assert event["data"]["run"]["status"] == "waiting"
    shown = agent_messages(talker, "t-wh-ask")
    assert message["id"] == shown[-1]["id"]  # `ask-<n>`: the question as the thread shows it
    assert not sent("thread.answered")

    # the receiver relays the reply as the thread's next message: the run goes on and answers
    assert post(talker, "t-wh-ask", "ORD-2", id="m-2").json()["run_id"] == str(asking.id)
    assert advance(asking).status == RunStatus.SUCCEEDED
    assert len(sent("thread.asked")) == 1  # the resumed slice found its wait: not asked again
    [answered] = sent("thread.answered")
    assert answered["data"]["thread"]["message"]["text"] == "got: ORD-2 from customer"


def test_a_stopped_turn_is_no_answer(talker, endpoint):
    asking = run_of(post(talker, "t-wh-stop", "ask me something", agent=ASKER))
    assert advance(asking).status == RunStatus.WAITING
    # an interrupt cancels the waiting run: it answered nothing
    turn = run_of(post(talker, "t-wh-stop", "never mind", multitask="interrupt"))
    asking.refresh_from_db()
    assert asking.status == RunStatus.CANCELLED
    assert not sent("thread.answered")
    assert advance(turn).status == RunStatus.SUCCEEDED
    assert [e["data"]["run"]["id"] for e in sent("thread.answered")] == [str(turn.id)]


def test_an_endpoint_gets_only_the_events_it_wants_and_secrets_are_masked(talker):
    WebhookEndpoint.objects.create(
        url="http://127.0.0.1:9/a", secret=SECRET, event_types=["thread.asked"]
    )
    run = run_of(
        post(talker, "t-wh-key", "my key is sk-live-abcdefghijklmnopqrstuvwx", agent=AGENT)
    )
    assert advance(run).status == RunStatus.SUCCEEDED
    assert not WebhookDelivery.objects.exists()  # nobody wants thread.answered

    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/b", secret=SECRET)
    again = run_of(post(talker, "t-wh-key", "and again sk-live-abcdefghijklmnopqrstuvwx"))
    assert advance(again).status == RunStatus.SUCCEEDED
    [event] = sent("thread.answered")
    text = event["data"]["thread"]["message"]["text"]
    assert "heard:" in text and "sk-live-abcdefghijklmnopqrstuvwx" not in text


def test_no_endpoint_writes_nothing(talker):
    run = run_of(post(talker, "t-wh-none", "hello", agent=AGENT))
    assert advance(run).status == RunStatus.SUCCEEDED
    assert not WebhookDelivery.objects.exists()
