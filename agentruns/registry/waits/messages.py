"""Waiting for the customer within a turn: `ask_customer` (a tool the model calls) and
`wait_for_message` (tool code).

A run of a thread (`POST /api/threads/<id>/messages`) parks until the thread's next message,
which answers the wait instead of starting a run of its own: the agent asks "which order do you
mean?" and goes on with the reply, its tool state and its turn intact. `waiting_for` says
`message`. One run of a thread waits for its next message at a time (the token
`message:<thread id>`, held as any wait token is); an `interrupt` post cancels the waiting run
and starts a turn of its own instead.

A chat (the AI SDK's useChat, `Thread.chat`) has no such wait: its turns are the customer's
messages, so `ask_customer` tells the model to ask in its answer and the reply comes as the next
turn with the whole history, and `wait_for_message` fails with `NotAConversation`. A run of no
thread fails the same way.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentruns.registry.waits import events
from agentruns.registry.waits.events import EventWaitFailed
from agentruns.registry.waits.questions import checked_question


class NotAConversation(EventWaitFailed):
    """The run cannot wait for a message here (no thread, or a chat's turn)."""


def message_token(thread_id: str) -> str:
    return f"{events.MESSAGE_TOKEN_PREFIX}{thread_id}"


def wait_for_message(
    *, question: str | None = None, timeout: float | timedelta | None = None
) -> dict[str, Any]:
    """Wait for the next message posted to the run's thread; return it as
    `{"text", "author" ("customer" or "staff"), "sender"}`.

    Called from a tool while it runs in a run. `question`: what the customer was asked (the
    thread shows it while the run waits). `timeout` (seconds or a timedelta): then
    `EventTimedOut`. `NotAConversation` in a run of no thread or in a chat; `TokenHeld` when
    another run of the thread already waits for its next message."""
    reply = events.engine().message(question, events.wait_timeout(timeout))
    if not isinstance(reply, dict):
        raise EventWaitFailed("the message wait was resolved without a message")
    return reply


def ask_customer(question: str) -> dict[str, Any] | str:
    """Ask the customer of this conversation a question only they can answer (which order they
    mean, the amount, what arrived broken) and wait for their reply. Returns `{"reply": their
    text, "from": "customer" or "staff"}`. Ask one short question at a time; look up what you can
    with other tools first.

    Args:
        question: the question, as the customer should read it.
    """
    text = checked_question(question, "ask_customer")
    try:
        reply = wait_for_message(question=text)
    except EventWaitFailed as exc:  # not a conversation here, or another turn asked first
        return str(exc)
    return {"reply": reply.get("text", ""), "from": reply.get("author", "customer")}
