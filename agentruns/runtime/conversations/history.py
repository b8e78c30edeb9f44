"""The history a thread's run is given, and its answer stored once (issue 33).

A run of a thread (it has a `ThreadTurn`) begins by entering its message into the thread's
history (`enter`: appended after the thread's newest message, under the thread's row lock), once:
every later slice of the run finds the entry and reads the same history up to it, so the agent's
loop replays deterministically whatever the thread did meanwhile. The message is the last
request of the history the agent's loop is given (`agent.run(None, message_history=...)`), with
its author in its metadata. When the agent's loop returns, `record_answer` appends the run's new
messages (`result.new_messages()`) once (`ThreadTurn.answered`, under the same lock), and the
`thread.answered` webhook in the same commit: a slice that dies after it and before the run's end
commit replays to the same answer and stores (and announces) nothing.

A run that does not end by its agent's answer stores no answer: its message stays in the history,
so the next turn's model sees what the customer said. A cancelled one (an interrupt, a stop)
stores what it did before (`transcript.py`: the tool steps that completed stay done, and the next
turn's model reads them); a failed one may be retried, and stores its answer if the retry
succeeds.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationEntry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, UserPromptPart

from agentruns.models import TERMINAL_RUN_STATUSES, Run, Thread, ThreadTurn
from agentruns.runtime.conversations.store import (
    ThreadStore,
    author_metadata,
    message_text,
    run_now,
)
from agentruns.runtime.inbox import inbox


def turn_of(run: Run) -> ThreadTurn | None:
    """The run's turn of its thread (a run of no thread costs no query)."""
    if run.thread_id is None:
        return None
    return ThreadTurn.objects.filter(run_id=run.id).select_related("thread").first()


def prompt_message(turn: ThreadTurn, text: str) -> ModelRequest:
    return ModelRequest(
        parts=[UserPromptPart(text)], metadata=author_metadata(turn.author, turn.user_id, turn.text)
    )


def enter(turn: ThreadTurn, text: str) -> str:
    """The turn's message in the thread's history (appended now, or found): its entry id."""
    if turn.entry_id is not None:
        return turn.entry_id
    with transaction.atomic():
        Thread.objects.select_for_update().filter(id=turn.thread_id).first()
        fresh = ThreadTurn.objects.select_for_update().get(id=turn.id)
        if fresh.entry_id is None:
            store = ThreadStore(run_id=turn.run_id)
            conversation = run_now(store.load(turn.thread_id)) or Conversation(
                conversation_id=turn.thread_id
            )
            missed = _never_entered_before(fresh)
            conversation.messages.extend(prompt_message(m, m.text) for m in missed)
            conversation.messages.append(prompt_message(turn, text))
            entries = run_now(store.save(conversation))
            fresh.entry_id = entries[-1].id
            for earlier, entry in zip(missed, entries[-1 - len(missed) : -1], strict=True):
                ThreadTurn.objects.filter(id=earlier.id).update(entry_id=entry.id)
            ThreadTurn.objects.filter(id=turn.id).update(entry_id=fresh.entry_id)
    turn.entry_id = fresh.entry_id
    return turn.entry_id


def _never_entered_before(turn: ThreadTurn) -> list[ThreadTurn]:
    """The thread's earlier turns whose runs ended before they began (cancelled while they
    waited): what the customer said then is said all the same, in its place before this one."""
    return list(
        ThreadTurn.objects.filter(
            thread_id=turn.thread_id,
            entry_id=None,
            run__status__in=TERMINAL_RUN_STATUSES,
            created_at__lt=turn.created_at,
        ).order_by("created_at", "id")
    )


def history_for(run: Run, text: str) -> list[ModelMessage] | None:
    """The messages a thread's run is given, its own message last (None: not a thread's run)."""
    turn = turn_of(run)
    if turn is None:
        return None
    entry_id = enter(turn, text)
    store = ThreadStore(run_id=run.id)
    return [entry.message for entry in run_now(store.read_history(entry_id))]


def record_answer(run: Run, messages: list[ModelMessage], usage: Any) -> None:
    """Append the run's answer (its own messages) to its thread, once, and tell the outside
    world (`thread.answered`) in the same commit."""
    record_messages(run.id, run.thread_id, messages, usage, answer=True)


def record_messages(
    run_id: Any,
    thread_id: str | None,
    messages: list[ModelMessage],
    usage: Any = None,
    *,
    answer: bool = False,
) -> None:
    """Append the run's own messages (its `answer`, or what a stopped run did) to its thread,
    once: `ThreadTurn.answered`, under the thread's row lock."""
    if thread_id is None:
        return
    turn = ThreadTurn.objects.filter(run_id=run_id).first()
    if turn is None or turn.answered:
        return
    with transaction.atomic():
        Thread.objects.select_for_update().filter(id=turn.thread_id).first()
        if ThreadTurn.objects.filter(id=turn.id, answered=True).exists():
            return
        store = ThreadStore(run_id=run_id)
        conversation = run_now(store.load(turn.thread_id))
        if conversation is None:
            return  # the thread was deleted meanwhile
        conversation.messages.extend(messages)
        if usage is not None:
            conversation.usage.incr(usage)
        entries = run_now(store.save(conversation))
        ThreadTurn.objects.filter(id=turn.id).update(answered=True)
        if answer and entries:
            _announce_answer(run_id, turn.thread_id, entries)


def _announce_answer(run_id: Any, thread_id: str, entries: list[ConversationEntry]) -> None:
    """`thread.answered` with what the thread shows of the answer: its last response that says
    something (the final text, or the calls of an answer given by an output tool)."""
    said = [e for e in entries if isinstance(e.message, ModelResponse) and message_text(e.message)]
    answer = said[-1] if said else entries[-1]
    inbox().agent_said(
        run_id,
        thread_id,
        asked=False,
        message_id=answer.id,
        text=message_text(answer.message),
        sent_at=timezone.now(),
    )


def fork_thread(source: Run, *, user: Any = None) -> Thread | None:
    """A fork of a thread's run continues a fork of its thread: a new thread that shares the
    history up to the source's message (`ConversationStore.fork` from that entry: no message
    is copied). None: the source is no thread's turn, or its message never entered."""
    turn = turn_of(source)
    if turn is None or turn.entry_id is None:
        return None
    store = ThreadStore(agent=source.agent)
    forked = run_now(store.fork(turn.thread_id, from_entry=turn.entry_id))
    Thread.objects.filter(id=forked.conversation_id).update(
        created_by=user if getattr(user, "is_authenticated", False) else None
    )
    return Thread.objects.get(id=forked.conversation_id)


def add_fork_turn(source: Run, fork: Run, thread: Thread) -> None:
    """The fork's turn of the forked thread: the source's message, already in its history."""
    turn = ThreadTurn.objects.get(run_id=source.id)
    ThreadTurn.objects.create(
        thread=thread,
        run=fork,
        author=turn.author,
        user_id=turn.user_id,
        text=turn.text,
        multitask=turn.multitask,
        entry_id=turn.entry_id,
    )
