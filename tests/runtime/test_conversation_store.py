"""Pydantic AI's ConversationStore over our tables (issue 33): each message stored once, a
compare-and-set on the record's revision, a fork that points at an entry instead of copying;
and a fork of a thread's run continuing a fork of its thread."""

from __future__ import annotations

import pytest
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from agentruns import services
from agentruns.models import Thread, ThreadMessage, ThreadTurn
from agentruns.runtime.conversations.store import ThreadStore, run_now
from agentruns.selectors.threads import thread_messages
from agentruns.services.threads import post_message
from tests import thread_agents  # noqa: F401  (registers pa-talk)
from tests.helpers import advance, make_user, steps

pytestmark = pytest.mark.django_db


def ask(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text)])


def said(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


def test_each_message_is_stored_once_and_a_fork_points_at_an_entry():
    store = ThreadStore(agent="pa-talk")
    talk = Conversation(conversation_id="s-1", messages=[ask("one"), said("1")])
    first = run_now(store.save(talk))
    talk.messages += [ask("two"), said("2")]
    second = run_now(store.save(talk))
    assert len(first) == 2 and len(second) == 2  # only the new ones
    assert ThreadMessage.objects.filter(thread_id="s-1").count() == 4
    loaded = run_now(store.load("s-1"))
    assert [m.parts[0].content for m in loaded.messages] == ["one", "1", "two", "2"]

    stale = Conversation(conversation_id="s-1", messages=[ask("x")], revision="not-it")
    with pytest.raises(ConversationConflict):
        run_now(store.save(stale))

    fork = run_now(store.fork("s-1", from_entry=first[-1].id, new_conversation_id="s-1b"))
    assert [m.parts[0].content for m in fork.messages] == ["one", "1"]
    assert ThreadMessage.objects.count() == 4  # nothing copied
    assert Thread.objects.get(id="s-1b").forked_from == "s-1"
    fork.messages += [ask("other"), said("!")]
    run_now(store.save(fork))
    assert [m.parts[0].content for m in run_now(store.load("s-1b")).messages] == [
        "one",
        "1",
        "other",
        "!",
    ]
    assert len(run_now(store.load("s-1")).messages) == 4  # the original is unchanged


def test_a_fork_of_a_threads_run_continues_a_fork_of_the_thread(django_user_model, lead):
    customer = make_user(django_user_model, "customer", ["agentruns.start_run"])
    first = advance(post_message("t-f", "hello", user=customer, agent="pa-talk").run)
    second = advance(post_message("t-f", "lookup please", user=customer).run)
    assert second.status == "succeeded"
    model_turns = [s.index for s in steps(second, "model")]
    fork = services.fork_run(second.id, model_turns[-1], user=lead)
    turn = ThreadTurn.objects.get(run=fork)
    assert turn.thread_id != "t-f" and turn.thread.forked_from == "t-f"
    assert fork.thread_id == turn.thread_id
    before = ThreadMessage.objects.filter(thread_id="t-f").count()
    assert advance(fork).status == "succeeded"
    assert fork.output == second.output
    # the fork's thread shares the history up to the message (nothing copied); the answer is
    # stored in the fork's thread only
    texts = [m.text for m in thread_messages(Thread.objects.get(id=turn.thread_id))]
    assert texts[:3] == ["hello", first.output, "lookup please"]
    assert texts[-1] == fork.output
    assert ThreadMessage.objects.filter(thread_id="t-f").count() == before
    assert (
        ThreadMessage.objects.filter(thread_id=turn.thread_id).count() == 3
    )  # call, return, answer
