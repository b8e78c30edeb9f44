"""Reads for the inbox and the approvals API.

Every read here costs a bounded number of queries whatever the number of items: the page itself
(keyset pagination, `agentruns/selectors/pagination.py`), one capped COUNT for the header, and
the batched side reads in `cards.build_cards`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Prefetch, Q, QuerySet, prefetch_related_objects
from django.utils import timezone

from agentruns.selectors.pagination import KeysetPage, keyset_page
from approvals.models import Approval, ApprovalDecision, ApprovalKind, ApprovalStatus

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
    overdue: bool = False  # only items past their due time

    @classmethod
    def from_query(cls, params) -> InboxFilters:
        kind = params.get("kind", "")
        age = params.get("age", "")
        return cls(
            kind=kind if kind in ApprovalKind.values else "",
            agent=params.get("agent", "").strip()[:100],
            age=age if age in AGES else "",
            overdue=params.get("overdue", "") in ("1", "on", "true"),
        )

    @property
    def active(self) -> bool:
        return bool(self.kind or self.agent or self.age or self.overdue)


# priority (its run's), then age: the newest first, as the inbox has always listed items
INBOX_ORDER = ("-priority", "-created_at", "-id")


def approvals_query(
    status: str = ApprovalStatus.PENDING, kind: str = "", agent: str = "", age: str = ""
) -> QuerySet[Approval]:
    """Approvals, the highest priority first, then the newest, with everything a card or the API
    payload reads joined in."""
    qs = (
        Approval.objects.select_related(
            "run", "run__created_by", "step", "decided_by", "claimed_by"
        )
        .prefetch_related(decisions())
        .order_by(*INBOX_ORDER)
    )
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


def decisions() -> Prefetch:
    """Each item's decision rows, oldest first: the model's own order (its item's, then the
    decision's) joins every row to its item to sort by the item's order, for lists that are
    per item anyway."""
    return Prefetch("decisions", queryset=ApprovalDecision.objects.order_by("decided_at", "id"))


COUNT_CAP = 10_000
# overdue items shown above the first page; beyond it "N more overdue" links to the filter
OVERDUE_CAP = 50


@dataclass
class InboxPage(KeysetPage[Approval]):
    total: int = 0  # COUNT_CAP + 1 means "more than COUNT_CAP"
    # items past their due time, most overdue first, pinned above the page
    overdue: list[Approval] = field(default_factory=list)
    more_overdue: bool = False

    @property
    def total_label(self) -> str:
        return f"{COUNT_CAP}+" if self.total > COUNT_CAP else str(self.total)

    @property
    def shown(self) -> list[Approval]:
        return [*self.overdue, *self.items]


def inbox_page(
    filters: InboxFilters, *, older: str | None = None, newer: str | None = None, size: int = 25
) -> InboxPage:
    """One page of pending items, the highest priority first, then the newest (keyset
    pagination: the database walks the (status, -priority, -created_at) index from the cursor, so
    a deep page is as cheap as the first).

    Overdue items come first: every page leads with up to OVERDUE_CAP of them, the highest
    priority first, then the most overdue, and the pages list the others (`?overdue=1` lists only
    the overdue ones)."""
    qs = approvals_query(
        status=ApprovalStatus.PENDING, kind=filters.kind, agent=filters.agent, age=filters.age
    ).prefetch_related(None)  # the decisions of the items that show them, below
    due = Q(due_at__lte=timezone.now())
    # a bounded count: exact up to COUNT_CAP, "10000+" beyond, so the header costs the same at
    # a million pending items (measured: 1.8 ms at 10,000 on PostgreSQL); the overdue ones
    # counted with them, so a page with none (the usual page) does not ask for them again
    counts = qs.order_by()[: COUNT_CAP + 1].aggregate(
        total=Count("pk"), due=Count("pk", filter=due)
    )
    total = counts["total"]
    if filters.overdue:
        page = keyset_page(qs.filter(due), older=older, newer=newer, size=size, rank="priority")
        _with_decisions(page.items)
        return InboxPage(page.items, page.older, page.newer, total=total)
    page = keyset_page(qs.exclude(due), older=older, newer=newer, size=size, rank="priority")
    # pinned above every page (the pages list the others): what is late is never out of sight
    overdue = []
    if counts["due"] or total > COUNT_CAP:  # (past the cap the count may have missed them)
        overdue = list(qs.filter(due).order_by("-priority", "due_at", "id")[: OVERDUE_CAP + 1])
    found = InboxPage(
        page.items,
        page.older,
        page.newer,
        total=total,
        overdue=overdue[:OVERDUE_CAP],
        more_overdue=len(overdue) > OVERDUE_CAP,
    )
    _with_decisions(found.shown)
    return found


def _with_decisions(items: list[Approval]) -> None:
    """The decision rows of the items that need more than one approver (their cards list this
    round's approvals, `Approval.current_approvals`), in one query; none for a page without
    such items (the usual page), which the card never reads them for."""
    prefetch_related_objects([a for a in items if a.is_multi], decisions())
