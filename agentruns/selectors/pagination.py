"""Keyset ("seek") pagination, newest first, for every list of the app (runs, the inbox).

Instead of OFFSET + COUNT, each page is one indexed range scan of `size + 1` rows from a cursor
on (created_at, primary key), so page 400 costs what page 1 costs and rows arriving at the top
while someone pages do not shift what "older" means. A cursor is `<microseconds>-<pk>`: exact
integers, because a float timestamp can be off by one and skip or repeat a row. A list ordered
by another timestamp (the inbox's decided items, by `decided_at`) names it as `field`; its rows
must all have one (filter out the NULLs).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from django.db.models import Model, Q, QuerySet

from agentruns.runtime.values.ids import parse_id

T = TypeVar("T", bound=Model)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_cursor(row: Model, field: str = "created_at") -> str:
    micros = (getattr(row, field) - EPOCH) // timedelta(microseconds=1)
    return f"{micros}-{row.pk}"


def decode_cursor(
    raw: str | None, parse_pk: Callable[[str], Any] = parse_id
) -> tuple[datetime, Any] | None:
    """(created_at, pk) of a cursor; None for anything that is not one (a garbled link, or
    digits that are not ASCII: "١٤" is not 14)."""
    micros, _, pk = (raw or "").partition("-")
    try:
        return EPOCH + timedelta(microseconds=parse_id(micros)), parse_pk(pk)
    except (ValueError, OverflowError):
        return None


def parse_uuid(raw: str) -> uuid.UUID:
    return uuid.UUID(raw)


@dataclass
class KeysetPage(Generic[T]):
    items: list[T] = field(default_factory=list)
    older: str | None = None  # cursor of the next (older) page
    newer: str | None = None  # cursor of the previous (newer) page

    @property
    def is_first(self) -> bool:
        return self.newer is None

    @property
    def has_other_pages(self) -> bool:
        return bool(self.older or self.newer)


def keyset_page(
    rows: QuerySet[T],
    *,
    older: str | None = None,
    newer: str | None = None,
    size: int,
    parse_pk: Callable[[str], Any] = parse_id,
    field: str = "created_at",
) -> KeysetPage[T]:
    """One page of `rows`, newest first by `field` (then pk). `older`: the rows older than that
    cursor; `newer`: the page just newer than it (a full page: when fewer than `size` rows are
    newer, the first page).

    The redundant `<field> <=` bound is what lets PostgreSQL start the index scan at the
    cursor (the OR alone would be a filter, and deep pages would scan every row before)."""
    seek_older = decode_cursor(older, parse_pk)
    seek_newer = decode_cursor(newer, parse_pk) if seek_older is None else None
    if seek_newer is not None:
        at, pk = seek_newer
        ascending = list(
            rows.filter(**{f"{field}__gte": at})
            .filter(Q(**{f"{field}__gt": at}) | Q(**{field: at, "pk__gt": pk}))
            .order_by(field, "pk")[: size + 1]
        )
        if len(ascending) <= size:  # this is the first page: show it whole
            return keyset_page(rows, size=size, parse_pk=parse_pk, field=field)
        items = ascending[:size][::-1]
        return KeysetPage(
            items, older=encode_cursor(items[-1], field), newer=encode_cursor(items[0], field)
        )
    if seek_older is not None:
        at, pk = seek_older
        rows = rows.filter(**{f"{field}__lte": at}).filter(
            Q(**{f"{field}__lt": at}) | Q(**{field: at, "pk__lt": pk})
        )
    found = list(rows.order_by(f"-{field}", "-pk")[: size + 1])
    items = found[:size]
    page = KeysetPage(items)
    if len(found) > size:
        page.older = encode_cursor(items[-1], field)
    if seek_older is not None and items:
        page.newer = encode_cursor(items[0], field)
    return page
