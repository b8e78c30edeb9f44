"""Posting a message to a thread: the next run of the conversation (issue 33).

A thread is a conversation of runs, one run per message (`models/threads.py`). Posting creates
the thread if it is new (its agent named), then starts the message's run in the same
transaction, one run of a thread at a time: when another run of the thread has not ended, the
new one waits in the thread's line behind it and takes its turn when that one ends
(`runtime/dispatch/thread_line.py`); its agent's concurrency key (an order's line) applies to it
as to any run. What happens to the active run is the post's `multitask`:

- `enqueue` (the default): it finishes, or parks, and the new message's run follows;
- `interrupt`: it is cancelled (the cancel service: completed tool steps stay done, a call in
  flight finishes first) and the new message's run follows at once;
- `reject`: the post is refused (`ThreadBusy`, the API's 409) and nothing is stored.

A run parked for a person or a system does not hold the thread's turn (`thread_line`): a message
posted while every run of the thread is parked starts at once, and `reject` takes it. An
`interrupt` cancels the thread's oldest run that has not ended, parked or not: the turn the new
message supersedes first (the customer changed their mind about the refund that waits for
approval). In a chat (`Thread.chat`) a parked turn keeps the thread.

A run of the thread that waits for its next message (`ask_customer`, `wait_for_message`) is
answered by the message instead (`runtime/waits/replies.py`): no run is started, the waiting
one resumes with it; an `interrupt` post cancels the waiting run and starts its own turn.

The new run's input is the thread's first run's input with `message` the new text (an agent
that reads, say, an order id from its input gets the thread's), and the agent's loop is given
the whole history (`runtime/conversations/history.py`). A message posted with the sender's own
id (`client_id`, the AI SDK's message id) twice is one turn: the second post returns the first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentruns.models import (
    TERMINAL_RUN_STATUSES,
    Author,
    Run,
    RunStatus,
    Thread,
    ThreadKey,
    ThreadTurn,
    Wait,
)
from agentruns.registry import get_agent
from agentruns.runtime.access import quotas
from agentruns.runtime.conversations import history
from agentruns.runtime.dispatch import thread_line
from agentruns.runtime.engine import agents
from agentruns.runtime.execution.cancel import cancel_run
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.runtime.values.ids import actor_name, uuid7
from agentruns.runtime.values.text import UnsafeValue, check_text
from agentruns.runtime.waits import replies
from agentruns.services.actions import OPERATE, may_stop
from agentruns.services.start import START_PERMISSION, may_repeat, start_run

MULTITASK = ("enqueue", "interrupt", "reject")
MAX_TEXT_CHARS = 5000


class ThreadRefused(ValueError):
    """The post cannot be taken: `status` is the API's answer."""

    def __init__(self, message: str, status: int = 400, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.extra = status, extra


@dataclass(frozen=True)
class Posted:
    thread: Thread
    turn: ThreadTurn | None  # None: the message answered a run waiting for it (`reply`)
    run: Run
    created: bool  # False: a repeat of a post with the same client id
    reply: Wait | None = None  # the message wait the message answered


def new_thread_id() -> str:
    """A thread id of ours: random (122 bits), so nobody can predict it and make it first."""
    return str(uuid.uuid4())


def _thread_for_post(
    thread_id: str, agent: str | None, user: Any, chat: bool, *, mine: bool = False
) -> Thread:
    """The thread's row, locked; created with `agent` (a chat's if `chat`) when it is new.
    `mine`: an id of ours for the caller (`thread_for_key`), which never names a thread another
    user made."""
    thread = Thread.objects.select_for_update().filter(id=thread_id).first()
    if thread is not None and mine and thread.created_by_id != getattr(user, "pk", None):
        raise ThreadRefused(f"thread {thread_id} is another user's: it is not yours to join", 409)
    if thread is None:
        if agent is None:
            raise ThreadRefused(f"no thread {thread_id}: its first message names its agent", 404)
        try:
            with transaction.atomic():
                Thread.objects.create(
                    id=thread_id,
                    agent=agent,
                    chat=chat,
                    revision=str(uuid7()),
                    updated_at=timezone.now(),
                    created_by=user if getattr(user, "is_authenticated", False) else None,
                )
        except IntegrityError:
            pass  # a concurrent first message made it
        thread = Thread.objects.select_for_update().get(id=thread_id)
    if agent is not None and agent != thread.agent:
        raise ThreadRefused(
            f"thread {thread_id} is a conversation with agent {thread.agent}, not {agent}", 409
        )
    if thread.chat and not chat and not _may_post_to_chat(thread, user):
        raise ThreadRefused(
            f"thread {thread_id} is another user's chat: only its user (or an operator) may "
            "add to it",
            403,
        )
    if chat and not thread.chat:  # the API made it, a chat continues it: a chat's from now on
        Thread.objects.filter(id=thread.id).update(chat=True)
        thread.chat = True
    return thread


def thread_for_key(key: str | None, agent: str, user: Any) -> str:
    """The id of the thread `POST /api/runs` with `"thread": true` starts: a new random one, or,
    with the caller's Idempotency-Key, the one that user's key made before with this agent
    (`ThreadKey`), so a repeat is the same thread and run. Inside the transaction that posts the
    thread's first message (`post_message` with no thread id): a concurrent repeat of the key
    waits on the key's row and then finds the thread it names; a post that fails leaves no key
    behind."""
    thread_id = new_thread_id()
    if key is None or not getattr(user, "is_authenticated", False):
        return thread_id
    mapped = ThreadKey.objects.filter(user=user, agent=agent, key=key)
    found = mapped.values_list("thread_id", flat=True).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            ThreadKey.objects.create(user=user, agent=agent, key=key, thread_id=thread_id)
    except IntegrityError:  # a concurrent repeat of the key made it first
        return mapped.values_list("thread_id", flat=True).get()
    return thread_id


def _check_same_sender(sender_id: Any, user: Any, client_id: str) -> None:
    """Another user's message id never stands in for yours (`may_repeat`)."""
    if not may_repeat(sender_id, user):
        raise ThreadRefused(
            f"message id {client_id!r} is another sender's on this thread: use an id of your own",
            409,
        )


def may_post(thread: Thread, user: Any) -> bool:
    """Whether a post by `user` to `thread` would be taken (the run page offers its form only
    then): they may start runs, and a chat's thread takes posts from its user or an operator."""
    if user is not None and not user.has_perm(START_PERMISSION):
        return False
    return not thread.chat or _may_post_to_chat(thread, user)


def _may_post_to_chat(thread: Thread, user: Any) -> bool:
    """A chat is its user's own (the chat endpoint finds only its user's): through the threads
    API its user, an operator, or the system (no user) may add to it."""
    if user is None:
        return True
    if not getattr(user, "is_authenticated", False):
        return False
    return thread.created_by_id == user.pk or user.has_perm(OPERATE)


def active_runs(thread: Thread) -> list[Run]:
    """The thread's runs that have not ended, oldest first."""
    return list(
        Run.objects.filter(thread_id=thread.id)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .order_by("created_at", "id")
    )


def post_message(
    thread_id: str | None,
    text: str,
    *,
    user: Any = None,
    agent: str | None = None,
    author: str = Author.CUSTOMER,
    multitask: str = "enqueue",
    client_id: str | None = None,
    run_input: dict | None = None,
    priority: int = 0,
    traceparent: str | None = None,
    chat: bool = False,
) -> Posted:
    """Add a message to the thread (created with `agent` if new, a chat's if `chat`) and start
    its run. `thread_id` None: a thread of ours for the caller (`thread_for_key`, with
    `client_id` as their key), in the transaction of the post. Each post counts against the
    sender's thread posts before anything is decided (a refused one too)."""
    quotas.check_post(user)
    text = (text or "").strip()
    if not text:
        raise ThreadRefused("the message needs text")
    if len(text) > MAX_TEXT_CHARS:
        raise ThreadRefused(f"the message is longer than {MAX_TEXT_CHARS} characters")
    try:
        check_text(text, "the message")
        if thread_id is not None:
            check_text(thread_id, "the thread id")
    except UnsafeValue as exc:
        raise ThreadRefused(str(exc)) from None
    if multitask not in MULTITASK:
        raise ThreadRefused(f"multitask must be one of {', '.join(MULTITASK)}")
    if author not in (Author.CUSTOMER, Author.STAFF):
        raise ThreadRefused("a message is the customer's or staff's")
    with transaction.atomic():
        mine = thread_id is None
        if thread_id is None:  # an id of ours: a repeat of the key finds the thread it made
            if agent is None:
                raise ThreadRefused("a new thread's first message names its agent")
            thread_id = thread_for_key(client_id, agent, user)
        thread = _thread_for_post(thread_id, agent, user, chat, mine=mine)
        if client_id is not None:
            repeat = ThreadTurn.objects.filter(thread=thread, client_id=client_id).first()
            if repeat is not None:
                _check_same_sender(repeat.user_id, user, client_id)
                return Posted(thread, repeat, repeat.run, False)
            answered = replies.answered_before(thread.id, client_id)
            if answered is not None:
                _check_same_sender(answered.payload.get("user"), user, client_id)
                return Posted(thread, None, answered.run, False, answered)
        active = active_runs(thread)
        if multitask != "interrupt" and any(r.status == RunStatus.WAITING for r in active):
            # a run waiting for the thread's next message gets it (a chat's never does)
            answering = replies.reply(
                thread.id, text, author=author, user=user, client_id=client_id
            )
            if answering is not None:
                return Posted(thread, None, Run.objects.get(id=answering.run_id), True, answering)
        holding = [run for run in active if thread_line.holds_turn(run.status, thread.chat)]
        if holding and multitask == "reject":
            raise ThreadBusy(thread, holding[0])
        if active and multitask == "interrupt":
            _interrupt(active, user)
        first = ThreadTurn.objects.filter(thread=thread).select_related("run").first()
        base = dict(first.run.input) if first is not None else {}
        started = start_run(
            thread.agent,
            {**base, **(run_input or {}), "message": text},
            user=user,
            priority=priority,
            traceparent=traceparent,
            thread_id=thread.id,
        )
        turn = ThreadTurn.objects.create(
            thread=thread,
            run=started.run,
            author=author,
            user=user if getattr(user, "is_authenticated", False) else None,
            text=text,
            client_id=client_id,
            multitask=multitask,
        )
        # its message enters the history when its run first executes (`history.history_for`:
        # its first slice), or when it is interrupted before that: a post stays a few statements
    return Posted(thread, turn, started.run, True)


class ThreadBusy(ThreadRefused):
    def __init__(self, thread: Thread, run: Run) -> None:
        super().__init__(
            f"thread {thread.id} has an active run ({run.status}): the message was not taken "
            '(post it with "multitask": "enqueue" or "interrupt")',
            409,
            run_id=str(run.id),
        )


def _interrupt(active: list[Run], user: Any) -> None:
    """Stop the thread's oldest run that has not ended, parked or not (the others stay): its
    model turn in flight ends within a second (`stop`), completed tool steps stay done. A run
    stopped before it began leaves its message in the history all the same. A person may only
    interrupt a run they may stop (the stop button's rule); the system (no user) may."""
    for run in active[:1]:
        if user is not None and not may_stop(user, run):
            raise ThreadRefused(
                f"you may not stop run {run.id} (only its starter or an operator may): "
                'interrupt refused (post with "multitask": "enqueue")',
                403,
                run_id=str(run.id),
            )
        try:
            cancel_run(
                run.id, who=actor_name(user), reason="interrupted by a new message", stop=True
            )
        except ActionRefused:
            pass  # it ended meanwhile
        turn = ThreadTurn.objects.get(run_id=run.id)
        if turn.entry_id is None:
            history.enter(turn, agents.prompt(get_agent(run.agent), run))
