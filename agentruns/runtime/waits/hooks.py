"""A hook: an outside system resolves a token a run waits on (`POST /api/hooks/<token>`).

Exactly once across processes: the pending wait is locked and set resolved in one transaction
(`transitions.settle_wait` queues its run in it). Only waits of kind `event` are hooks' (an
approval, a question or a timer has its own way to be resolved). A second delivery finds no
pending wait and the token's latest resolution: `WaitAlreadyResolved` (409) with its time; a
token nobody waits on, or only a run that has ended: `UnknownToken` (404).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentruns.models import Wait, WaitKind, WaitStatus
from agentruns.models.runs import TERMINAL_RUN_STATUSES
from agentruns.runtime import writer
from agentruns.runtime.execution.transitions import UnknownToken, WaitAlreadyResolved, settle_wait
from agentruns.runtime.waits.tools import HELD, RUN_ENDED

__all__ = ["UnknownToken", "WaitAlreadyResolved", "resolve_hook"]


def resolve_hook(token: str, payload: Any, *, by: str) -> Wait:
    """Resume the run waiting on `token` with `payload`; returns the wait (its `run_id`)."""
    with transaction.atomic():
        waits = Wait.objects.filter(token=token, kind=WaitKind.EVENT)
        wait = waits.select_for_update().filter(status=WaitStatus.PENDING).first()
        if wait is not None and wait.run.status in TERMINAL_RUN_STATUSES:
            wait.status, wait.error = WaitStatus.FAILED, f"its run ended ({wait.run.status})"
            wait.resolved_by, wait.resolved_at = RUN_ENDED, timezone.now()
            writer.save_wait(wait, ["status", "error", "resolved_by", "resolved_at"])
            wait = None
        if wait is None:
            earlier = (
                waits.exclude(resolved_by__in=[HELD, RUN_ENDED])
                .exclude(status=WaitStatus.PENDING)
                .order_by(F("resolved_at").desc(nulls_last=True), "-id")
                .first()
            )
            if earlier is None:
                raise UnknownToken(token)
            raise WaitAlreadyResolved(earlier)
        settle_wait(wait, payload, by=by)
    return wait
