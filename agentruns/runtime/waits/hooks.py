"""A hook: an outside system resolves a token a run waits on (`POST /api/hooks/<token>`).

Exactly once across processes: the pending wait is locked and set resolved in one transaction
(`transitions.settle_wait` queues its run in it). Only waits of kind `event` are hooks' (an
approval, a question or a timer has its own way to be resolved). A second delivery finds no
pending wait and the token's latest resolution: `WaitAlreadyResolved` (409) with its time; a
token nobody waits on, or only a run that has ended: `UnknownToken` (404).

A signed request's `webhook-id` is its receipt, stored in the resolving transaction: the same id
again is the sender's retry when it is sent to the same token (`WaitAlreadyResolved`, 409 naming
the run), else a replay (`HookReplayed`, 409), for as long as its signature would verify; a
request that resolved nothing left no receipt (its retry may).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agentruns.models import HookReceipt, Wait, WaitKind, WaitStatus
from agentruns.models.runs import TERMINAL_RUN_STATUSES
from agentruns.runtime import writer
from agentruns.runtime.execution.transitions import UnknownToken, WaitAlreadyResolved, settle_wait
from agentruns.runtime.waits.tools import HELD, RUN_ENDED

__all__ = ["HookReplayed", "UnknownToken", "WaitAlreadyResolved", "resolve_hook"]

# a signature verifies for five minutes either side of its timestamp (the reference library)
RECEIPTS_KEPT = timedelta(minutes=10)


class HookReplayed(Exception):
    def __init__(self, receipt: HookReceipt) -> None:
        super().__init__(
            f"webhook-id {receipt.webhook_id!r} was received already: a signed request is "
            "taken once (send a new event with a new id)"
        )
        self.receipt = receipt


def resolve_hook(token: str, payload: Any, *, by: str, receipt: str | None = None) -> Wait:
    """Resume the run waiting on `token` with `payload`; returns the wait (its `run_id`).
    `receipt`: the signed request's `webhook-id` (`HookReplayed` if it was taken before)."""
    with transaction.atomic():
        if receipt is not None:
            _take_receipt(receipt, token, by)
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


def _take_receipt(webhook_id: str, token: str, by: str) -> None:
    """Store the request's receipt; taken before: the sender's retry of a delivery to this
    token is answered as one (`WaitAlreadyResolved`, naming the run it resumed), any other
    repeat is a replay (`HookReplayed`)."""
    now = timezone.now()
    HookReceipt.objects.filter(received_at__lt=now - RECEIPTS_KEPT).delete()
    try:
        with transaction.atomic():
            HookReceipt.objects.create(webhook_id=webhook_id, token=token[:200], received_at=now)
    except IntegrityError:
        earlier = HookReceipt.objects.get(webhook_id=webhook_id)
        resolved = Wait.objects.filter(token=token, kind=WaitKind.EVENT, resolved_by=by)
        if earlier.token == token[:200] and (wait := resolved.order_by("-id").first()):
            raise WaitAlreadyResolved(wait) from None
        raise HookReplayed(earlier) from None
