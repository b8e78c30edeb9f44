"""Reading a thread (issue 33): its messages in order (who said what, when) and its runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentruns.models import Run, Thread, ThreadMessage, ThreadTurn
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
    views += [
        ThreadMessageView(
            f"turn-{t.id}", t.author, _name(t.user), t.text, str(t.run_id), t.created_at, False
        )
        for t in waiting.order_by("created_at", "id")
    ]
    return views


def thread_runs(thread: Thread) -> list[Run]:
    return list(
        Run.objects.filter(thread_turn__thread=thread)
        .select_related("created_by")
        .order_by("created_at", "id")
    )
