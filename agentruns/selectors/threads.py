"""Reading a thread (issue 33): its messages in order (who said what, when) and its runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentruns.models import (
    TERMINAL_RUN_STATUSES,
    Author,
    Run,
    Thread,
    ThreadMessage,
    ThreadTurn,
    Wait,
    WaitKind,
    WaitStatus,
)
from agentruns.registry.waits.messages import message_token
from agentruns.runtime.conversations.store import history_ids


@dataclass(frozen=True)
class ThreadMessageView:
    id: str
    author: str  # customer, staff, agent
    sender: str | None  # the user who sent it (a person's message)
    text: str
    run_id: str | None
    created_at: Any
    entered: bool  # in the history; False: waiting for its run to begin (or its run never did)
    note: str = ""  # what people read about a message not in the history yet


WAITING_TURN = "waiting for its turn"
ASKED = "waiting for the reply: the next message answers it"
REPLIED = "the reply: the run goes on with it"


def get_thread(thread_id: str) -> Thread | None:
    return Thread.objects.filter(id=thread_id).first()


def thread_of_run(run: Run) -> Thread | None:
    turn = ThreadTurn.objects.filter(run_id=run.id).select_related("thread").first()
    return None if turn is None else turn.thread


def _name(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def thread_messages(thread: Thread) -> list[ThreadMessageView]:
    """The thread's history (its chain to the newest message, a fork's shared part included),
    then the messages still waiting for their runs. Tool returns and empty turns are left out:
    they are in the runs' steps."""
    ids = history_ids(thread.head_id) if thread.head_id else []
    rows = {m.id: m for m in ThreadMessage.objects.filter(id__in=ids).select_related("user")}
    views = [
        ThreadMessageView(
            m.id,
            m.author,
            _name(m.user),
            m.text,
            str(m.run_id) if m.run_id else None,
            m.created_at,
            True,
        )
        for m in (rows[i] for i in ids)
        if m.text
    ]
    waiting = ThreadTurn.objects.filter(thread=thread, entry__isnull=True).select_related("user")
    pending = [
        ThreadMessageView(
            f"turn-{t.id}",
            t.author,
            _name(t.user),
            t.text,
            str(t.run_id),
            t.created_at,
            False,
            WAITING_TURN,
        )
        for t in waiting.order_by("created_at", "id")
    ]
    pending += _asked_and_replied(thread)
    return views + sorted(pending, key=lambda view: view.created_at)


def _asked_and_replied(thread: Thread) -> list[ThreadMessageView]:
    """The questions the thread's runs ask the customer (`ask_customer`) and the replies, while
    their runs have not stored them in the history (they do when they end)."""
    waits = (
        Wait.objects.filter(token=message_token(thread.id), kind=WaitKind.MESSAGE)
        .exclude(run__thread_turn__answered=True)
        .exclude(status=WaitStatus.FAILED)
        .exclude(status=WaitStatus.PENDING, run__status__in=TERMINAL_RUN_STATUSES)
        .order_by("created_at", "id")
    )
    views = []
    for wait in waits:
        asked = wait.asked if isinstance(wait.asked, dict) else {}
        if isinstance(asked.get("question"), str):
            views.append(
                ThreadMessageView(
                    f"ask-{wait.id}",
                    Author.AGENT,
                    None,
                    asked["question"],
                    str(wait.run_id),
                    wait.created_at,
                    False,
                    ASKED if wait.status == WaitStatus.PENDING else "",
                )
            )
        reply = wait.payload if isinstance(wait.payload, dict) else {}
        if wait.status == WaitStatus.RESOLVED and isinstance(reply.get("text"), str):
            author = reply.get("author")
            views.append(
                ThreadMessageView(
                    f"reply-{wait.id}",
                    author if author in (Author.CUSTOMER, Author.STAFF) else Author.CUSTOMER,
                    reply.get("sender") if isinstance(reply.get("sender"), str) else None,
                    reply["text"],
                    str(wait.run_id),
                    wait.resolved_at,
                    False,
                    REPLIED,
                )
            )
    return views


def thread_runs(thread: Thread) -> list[Run]:
    return list(
        Run.objects.filter(thread_turn__thread=thread)
        .select_related("created_by")
        .order_by("created_at", "id")
    )
