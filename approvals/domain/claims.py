"""Claims: "I'm on it". A person takes an item so others see it is being handled.

A claim is advisory: it never blocks a decision (the inbox asks for a confirmation before
deciding an item someone else holds). It lapses AGENTRUNS_CLAIM_SECONDS after it was taken or
last renewed (claiming your own item again renews it), so a forgotten tab does not hold an
item for ever. Taking an item is one compare-and-set: of two people claiming at once exactly
one wins; the other learns who holds it and since when.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentruns.runtime.store.nudges import nudge_on_commit
from approvals.conf import conf
from approvals.domain.policy import check_may_decide
from approvals.errors import AlreadyDecided, ClaimedByOther
from approvals.models import Approval, ApprovalStatus


def _load(approval_id: int) -> Approval:
    return Approval.objects.select_related("run", "step", "decided_by", "claimed_by").get(
        id=approval_id
    )


def claim(approval_id: int, *, user: Any) -> Approval:
    """Take (or renew) the item for `user`. AlreadyDecided when it is no longer pending,
    ClaimedByOther when someone else holds it. Approval.DoesNotExist for no such item. A claim
    answers with the full item, so it needs the rights of a decision (policy.NotAllowed)."""
    check_may_decide(user)
    now = timezone.now()
    lapsed_before = now - timedelta(seconds=conf.CLAIM_SECONDS)
    with transaction.atomic():
        # the conditional UPDATE is the arbiter: a concurrent claimer blocks on the row lock,
        # re-reads the winner's claim and matches nothing
        won = (
            Approval.objects.filter(id=approval_id, status=ApprovalStatus.PENDING)
            .filter(
                Q(claimed_by__isnull=True) | Q(claimed_by=user) | Q(claimed_at__lte=lapsed_before)
            )
            .update(claimed_by=user, claimed_at=now)
        )
        approval = _load(approval_id)
        if won:
            nudge_on_commit(approval.run_id, 0, inbox=True)
            return approval
    if approval.status != ApprovalStatus.PENDING:
        raise AlreadyDecided(approval)
    raise ClaimedByOther(approval, approval.claimed_by)


def release(approval_id: int, *, user: Any) -> Approval:
    """Give the item back. Releasing an item nobody holds (or whose claim lapsed) is a no-op;
    ClaimedByOther when someone else holds it."""
    with transaction.atomic():
        won = Approval.objects.filter(id=approval_id, claimed_by=user).update(
            claimed_by=None, claimed_at=None
        )
        approval = _load(approval_id)
        if won:
            nudge_on_commit(approval.run_id, 0, inbox=True)
            return approval
    holder = held_by_other(approval, user)
    if holder is not None:
        raise ClaimedByOther(approval, holder)
    return approval


def held_by_other(approval: Approval, user: Any) -> Any:
    """The person who holds the item, if it is not `user` (None otherwise)."""
    holder = approval.claimant()
    return holder if holder is not None and holder.pk != user.pk else None
