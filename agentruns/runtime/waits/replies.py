"""A message posted to a thread whose run waits for the thread's next message answers that wait
(`registry/waits/messages.py`) instead of starting a run of its own.

Exactly once: the pending wait and its run are locked and the wait resolved in the poster's
transaction (`transitions.settle_wait` queues its run in it); posts to one thread are serialised
by the thread's row lock, so of two messages the first answers and the second starts a turn. A pending wait whose run has ended holds
nothing: it is failed on the way and the message starts a turn as any other. A message posted
again with the sender's id (`client_id`) finds the wait it answered.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.models import Run, Wait, WaitKind, WaitStatus
from agentruns.models.runs import TERMINAL_RUN_STATUSES
from agentruns.registry.waits.messages import message_token
from agentruns.runtime import writer
from agentruns.runtime.execution.transitions import settle_wait
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.waits.tools import RUN_ENDED


def _message_waits(thread_id: str):  # noqa: ANN202  (a QuerySet of Wait)
    return Wait.objects.filter(token=message_token(thread_id), kind=WaitKind.MESSAGE)


def answered_before(thread_id: str, client_id: str) -> Wait | None:
    """The wait a message of this sender's id answered (a repeated post)."""
    return (
        _message_waits(thread_id)
        .filter(status=WaitStatus.RESOLVED, payload__client_id=client_id)
        .first()
    )


def reply(
    thread_id: str, text: str, *, author: str, user: Any, client_id: str | None
) -> Wait | None:
    """Answer the thread's pending message wait with this message (its run is queued on
    commit); None when no live run waits for one."""
    with transaction.atomic():
        waits = _message_waits(thread_id).filter(status=WaitStatus.PENDING)
        wait = waits.select_for_update().first()
        if wait is None:
            return None
        # the run's row too: a cancel (which locks it) either ended it before, and the message
        # is a turn of its own, or comes after the run was queued with the reply
        locked = Run.objects.select_for_update().filter(id=wait.run_id)
        status = locked.values_list("status", flat=True).first()
        if status is None or status in TERMINAL_RUN_STATUSES:
            wait.status, wait.error = WaitStatus.FAILED, f"its run ended ({status})"
            wait.resolved_by, wait.resolved_at = RUN_ENDED, timezone.now()
            writer.save_wait(wait, ["status", "error", "resolved_by", "resolved_at"])
            return None
        signed_in = getattr(user, "is_authenticated", False)
        payload = {
            "text": text,
            "author": author,
            "sender": user.get_username() if signed_in else None,
            "user": user.pk if signed_in else None,
            "client_id": client_id,
        }
        settle_wait(wait, payload, by=actor_name(user) or author)
    return wait
