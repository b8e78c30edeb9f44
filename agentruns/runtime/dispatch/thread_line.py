"""A thread's line: one run of a conversation at a time, beside its agent's concurrency key.

A thread's runs (`Run.thread`, one per message: `services/threads.py`) take turns in start
order. A run posted while an earlier run of its thread has not ended waits in the thread's
line: `waiting_behind` names that run, it has no concurrency key yet and no doorbell, and every
claim skips it (as a run in a key's line). When the run ahead ends, the next one leaves the
thread's line and takes its agent's concurrency key like any start (`concurrency.follow`):
admitted, or in the key's line. So a chat about an order is in the order's line as every other
run about that order (issue 30), and its turns still follow one another.

A run in the thread's line is one with a thread, a run ahead and no key. One that ends there (a
cancel) hands its place to the run behind it. A run that parks (for a person, an outside event,
a timer) lets the next turn go as an end does, and a message posted while the thread's runs are
all parked starts at once: the conversation goes on while a refund waits for its approval. The
parked run, resumed, runs beside the turns after it (its history is fixed at its own message;
its answer is appended to the thread when it ends), and its agent's concurrency key still keeps
two runs about one order apart. A chat's thread (`Thread.chat`) is the exception: its parked
turn keeps the thread, because the AI SDK continues a parked assistant message in place and the
chat's chunk cursor counts its turns one after the other (`stream/ui_thread.py`).

Races: a post places its run behind the newest run of the thread that holds the thread (not
ended, and not parked unless a chat), under that run's row lock (`place`), and a run's end or
park looks for the runs behind it under its own row lock (`follow`): either the post comes first
and the end sees its run, or the end comes first and the post no longer finds that run holding
the thread. SQLite serialises writers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from agentruns.models import TERMINAL_RUN_STATUSES, Run, RunStatus, Thread
from agentruns.runtime import writer
from agentruns.runtime.dispatch import concurrency
from agentruns.runtime.events import EventSpec, EventType


def _waiting_event(behind: uuid.UUID) -> EventSpec:
    return (
        EventType.RUN_STATUS,
        {
            "status": RunStatus.QUEUED,
            "reason": (
                f"waiting behind run {concurrency.short(behind)}: the thread's turn before it "
                "(one run of a thread at a time)"
            ),
            "waiting_behind": str(behind),
        },
    )


# a run that holds its thread's turn: not ended, and not parked (unless its thread is a chat)
HOLDS_TURN = ~Q(status__in=TERMINAL_RUN_STATUSES) & ~Q(status=RunStatus.WAITING, thread__chat=False)


def holds_turn(status: str, chat: bool) -> bool:
    """`HOLDS_TURN` of a run read already (its status, whether its thread is a chat)."""
    return status not in TERMINAL_RUN_STATUSES and (chat or status != RunStatus.WAITING)


def _holding(thread_id: str) -> Run | None:
    """The thread's newest run that holds the thread's turn."""
    return (
        Run.objects.filter(HOLDS_TURN, thread_id=thread_id)
        .order_by("-created_at", "-id")
        .only("id")
        .first()
    )


def _lock_holding(run_id: uuid.UUID) -> bool:
    """Lock the run's row; whether it still holds its thread's turn."""
    locked = Run.objects.select_for_update(of=("self",)).filter(HOLDS_TURN, id=run_id)
    return locked.values_list("id", flat=True).first() is not None


def place(run: Run, thread_id: str) -> list[EventSpec]:
    """A new run of the thread, before its row is written (inside the caller's transaction):
    behind the thread's newest run that holds the turn, with no key and no doorbell (the events
    that say so), or [] when there is none (the thread's active run: its agent's key decides)."""
    run.thread_id = thread_id
    while (ahead := _holding(thread_id)) is not None:
        if connection.vendor == "sqlite" or _lock_holding(ahead.id):
            run.waiting_behind, run.holds_key, run.enqueued_at = ahead.id, False, None
            run.concurrency_key = None
            return [_waiting_event(ahead.id)]
    return []


def _behind(run_id: uuid.UUID, thread_id: str) -> list[uuid.UUID]:
    return list(
        Run.objects.filter(thread_id=thread_id, waiting_behind=run_id, concurrency_key=None)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .order_by("created_at", "id")
        .values_list("id", flat=True)
    )


def follow(run_id: uuid.UUID | str, thread_id: str, ahead: uuid.UUID | None) -> None:
    """The thread's run `run_id` ends, inside the transaction that ends it: the run behind it
    takes its turn, or, when `run_id` itself waited in the line (`ahead`: the run it waited
    behind), waits behind that one instead."""
    run_id = uuid.UUID(str(run_id))
    if connection.vendor != "sqlite":
        Run.objects.select_for_update().filter(id=run_id).values_list("id").first()
    if ahead is not None:  # it leaves the line it waited in
        Run.objects.filter(id=run_id).update(waiting_behind=None)
    behind = _behind(run_id, thread_id)
    if not behind:
        return
    if ahead is not None:
        for waiting in behind:
            writer.append(waiting, [_waiting_event(ahead)], set_fields={"waiting_behind": ahead})
        return
    first, rest = behind[0], behind[1:]
    for waiting in rest:  # one line: the others wait behind the one that goes on
        writer.append(waiting, [_waiting_event(first)], set_fields={"waiting_behind": first})
    _take_turn(first)


def _take_turn(run_id: uuid.UUID) -> None:
    """The run leaves its thread's line and takes its agent's key as a start does."""
    run = Run.objects.only("id", "agent", "input").get(id=run_id)
    try:
        key = concurrency.key_for(run.agent, run.input)
    except concurrency.BadConcurrencyKey:
        key = None  # its input had a key when it was posted; a deploy changed the function
    if key is not None:
        Run.objects.filter(id=run_id).update(concurrency_key=key, waiting_behind=None)
        concurrency.follow(run_id, RunStatus.QUEUED, key=(run.agent, key))
        return
    writer.append(
        run_id,
        [(EventType.RUN_STATUS, {"status": RunStatus.QUEUED, "reason": "the thread's turn"})],
        set_fields={"waiting_behind": None, "enqueued_at": timezone.now()},
    )
    concurrency.ring([run_id])


def follow_change(run_id: uuid.UUID | str, status: str | None) -> str | None:
    """What a change of the run's status to `status` does to its thread's line, inside the
    transaction that writes it (`transitions.apply`: a writer that holds no lease). Returns the
    run's thread when the change ends it (None: no thread, or not an end)."""
    if status not in TERMINAL_RUN_STATUSES:
        return None
    found = (
        Run.objects.filter(id=run_id)
        .values_list("thread_id", "waiting_behind", "concurrency_key")
        .first()
    )
    if found is None or found[0] is None:
        return None
    thread_id, ahead, key = found
    follow(run_id, thread_id, ahead if key is None else None)
    return thread_id


def following(
    run_id: uuid.UUID,
    status: str | None,
    key: tuple[str, str | None] | None,
    thread_id: str | None,
) -> AbstractContextManager[None]:
    """Around the executor's commit of a change to `status`: its concurrency key's
    (`concurrency.following`) and, when a thread's run ends or parks, its thread's line, in one
    transaction (a running run is never in its thread's line)."""
    keys = concurrency.following(run_id, status, key)
    if thread_id is None:
        return keys
    if status in TERMINAL_RUN_STATUSES:
        return _thread_and_key(run_id, thread_id, keys, parks=False)
    if status == RunStatus.WAITING:
        return _thread_and_key(run_id, thread_id, keys, parks=True)
    return keys


@contextmanager
def _thread_and_key(
    run_id: uuid.UUID, thread_id: str, keys: AbstractContextManager[None], *, parks: bool
) -> Iterator[None]:
    with transaction.atomic(savepoint=False):
        if not parks or Thread.objects.filter(id=thread_id, chat=False).exists():
            follow(run_id, thread_id, None)  # a parked turn lets the next go (not in a chat)
        with keys:
            yield
