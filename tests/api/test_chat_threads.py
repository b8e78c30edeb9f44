"""The chat endpoint continues a chat (issue 33): the chat id is the thread id, each user message
the thread's next run; the runs' chunks make one cursor (no streaming read here: the real AI SDK
client reads the streams in tests/node/thread.test.mjs)."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Thread, ThreadTurn
from agentruns.stream.ui_stream import chunks_until_now
from tests import thread_agents  # noqa: F401  (registers pa-talk)
from tests.helpers import ApiClient, advance, make_user

pytestmark = pytest.mark.django_db

CHATTER = ["agentruns.view_run", "agentruns.start_run"]


def user(text: str, message_id: str) -> dict:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def assistant(message_id: str) -> dict:
    return {"id": message_id, "role": "assistant", "parts": [{"type": "text", "text": "..."}]}


def chat(client: ApiClient, chat_id: str, *messages: dict, **extra):
    response = client.post(
        "/api/chat/pa-talk",
        {"id": chat_id, "messages": list(messages), "trigger": "submit-message", **extra},
    )
    return response


@pytest.fixture
def chatter(django_user_model):
    return ApiClient(make_user(django_user_model, "chatter", CHATTER))


def test_the_next_user_message_continues_the_chat(chatter):
    first = chat(chatter, "c-1", user("hello", "u1"))
    assert first.status_code == 200 and first["x-chat-chunk-offset"] == "0"
    one = advance(Run.objects.get(id=first["x-run-id"]))
    # a repeated POST of the same message (a double submit, regenerate) is the same run
    assert chat(chatter, "c-1", user("hello", "u1"))["x-run-id"] == str(one.id)

    second = chat(chatter, "c-1", user("hello", "u1"), assistant("a1"), user("and now?", "u2"))
    assert second.status_code == 200 and second["x-run-id"] != str(one.id)
    assert second["x-chat-chunk-offset"] == str(chunks_until_now(one).count)
    two = advance(Run.objects.get(id=second["x-run-id"]))
    assert two.output == "heard: hello | and now?"
    assert [t.client_id for t in ThreadTurn.objects.filter(thread_id="c-1")] == ["u1", "u2"]

    # resume without startIndex: the latest turn; with one, the chat's cursor across turns
    latest = chatter.get("/api/chat/pa-talk/c-1/stream")
    assert latest["x-run-id"] == str(two.id)
    early = chatter.get("/api/chat/pa-talk/c-1/stream?startIndex=2")
    assert early["x-run-id"] == str(one.id) and early["x-chat-chunk-offset"] == "0"
    offset = chunks_until_now(one).count
    later = chatter.get(f"/api/chat/pa-talk/c-1/stream?startIndex={offset}")
    assert later["x-run-id"] == str(two.id) and later["x-chat-chunk-offset"] == str(offset)


def test_a_chats_parked_turn_keeps_the_chat(chatter):
    # (a thread of the threads API lets its next turn pass a parked one: tests/api/test_threads)
    first = chat(chatter, "c-park", user("refund 900", "u1"))
    parked = advance(Run.objects.get(id=first["x-run-id"]))
    assert parked.status == RunStatus.WAITING and Thread.objects.get(id="c-park").chat
    # the chat continues the parked assistant message in place: the next message waits for it
    second = chat(chatter, "c-park", user("refund 900", "u1"), assistant("a1"), user("hi", "u2"))
    assert Run.objects.get(id=second["x-run-id"]).waiting_behind == parked.id


def test_a_thread_the_api_made_is_a_chats_once_the_chat_continues_it(chatter):
    made = chatter.post(
        "/api/runs", {"agent": "pa-talk", "input": {"message": "refund 900"}, "thread": "c-api"}
    )
    assert made.status_code == 201 and not Thread.objects.get(id="c-api").chat
    parked = advance(Run.objects.get(id=made.json()["id"]))
    assert parked.status == RunStatus.WAITING
    # the chat's next message: the thread is a chat's now, and waits for the parked turn
    second = chat(chatter, "c-api", user("refund 900", "u1"), assistant("a1"), user("hi", "u2"))
    assert second.status_code == 200 and Thread.objects.get(id="c-api").chat
    assert Run.objects.get(id=second["x-run-id"]).waiting_behind == parked.id


def test_a_chat_is_its_users_own(chatter, django_user_model):
    chat(chatter, "c-mine", user("hello", "u1"))
    other = ApiClient(make_user(django_user_model, "other", CHATTER))
    refused = other.post(
        "/api/chat/pa-talk",
        {"id": "c-mine", "messages": [user("me too", "x1")], "trigger": "submit-message"},
    )
    assert refused.status_code == 409 and "another user's chat" in refused.json()["error"]
    assert other.get("/api/chat/pa-talk/c-mine/stream").status_code == 204
    assert ThreadTurn.objects.filter(thread_id="c-mine").count() == 1


def test_a_message_without_an_id_is_counted_by_its_place(chatter):
    bare = {"role": "user", "parts": [{"type": "text", "text": "hi"}]}
    first = chat(chatter, "c-bare", bare)
    again = chat(chatter, "c-bare", bare)
    assert first["x-run-id"] == again["x-run-id"]
    advance(Run.objects.get(id=first["x-run-id"]))
    second = chat(
        chatter, "c-bare", bare, assistant("a"), {**bare, "parts": [{"type": "text", "text": "2"}]}
    )
    assert second["x-run-id"] != first["x-run-id"]


def test_a_chat_is_one_agents(chatter):
    chat(chatter, "c-agent", user("hello", "u1"))
    other_agent = chatter.post(
        "/api/chat/pa-shop",
        {"id": "c-agent", "messages": [user("hi", "u2")], "trigger": "submit-message"},
    )
    assert other_agent.status_code == 409
    assert chatter.get("/api/chat/pa-shop/c-agent/stream").status_code == 204
    assert ThreadTurn.objects.filter(thread_id="c-agent").count() == 1
