"""Keyset ("seek") pagination, newest first, for every list of the app (runs, the inbox).

Instead of OFFSET + COUNT, each page is one indexed range scan of `size + 1` rows from a cursor
on (created_at, primary key), so page 400 costs what page 1 costs and rows arriving at the top
while someone pages do not shift what "older" means. A cursor is `<microseconds>-<pk>`: exact
integers, because a float timestamp can be off by one and skip or repeat a row. A list ranked
first by another field (the inbox: priority) leads its cursor with that value (`<rank>~...`). A
list ordered by another timestamp (the inbox's decided items, by `decided_at`) names it as
`field`; its rows must all have one (filter out the NULLs).
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


def encode_cursor(row: Model, *, rank: str | None = None, field: str = "created_at") -> str:
    """`<microseconds of field>-<pk>`, led by `<rank value>~` for a list ranked first by that
    field."""
    micros = (getattr(row, field) - EPOCH) // timedelta(microseconds=1)
    cursor = f"{micros}-{row.pk}"
    return f"{getattr(row, rank)}~{cursor}" if rank else cursor


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


def decode_ranked_cursor(
    raw: str | None, parse_pk: Callable[[str], Any] = parse_id
) -> tuple[int, datetime, Any] | None:
    """(rank, created_at, pk) of a ranked cursor (`<rank>~<microseconds>-<pk>`); None for
    anything else, an unranked cursor included."""
    rank, sep, rest = (raw or "").partition("~")
    seek = decode_cursor(rest, parse_pk) if sep else None
    negative = rank.startswith("-")
    digits = rank[1:] if negative else rank
    if seek is None or not (0 < len(digits) <= 6 and digits.isascii() and digits.isdigit()):
        return None
    return (-int(digits) if negative else int(digits)), *seek


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


def _past(fields: list[str], values: tuple, op: str) -> Q:
    """Rows whose (fields) come lexicographically after `values` (`op` "gt") or before ("lt"),
    with the leading field's bound (`gte`/`lte`) that lets the database start its index scan at
    the cursor (the OR alone would be a filter, and deep pages would scan every row before)."""
    beyond = Q()
    for i, name in enumerate(fields):
        step = Q(**{f"{name}__{op}": values[i]})
        for j in range(i):
            step &= Q(**{fields[j]: values[j]})
        beyond |= step
    return Q(**{f"{fields[0]}__{op}e": values[0]}) & beyond


def keyset_page(
    rows: QuerySet[T],
    *,
    older: str | None = None,
    newer: str | None = None,
    size: int,
    parse_pk: Callable[[str], Any] = parse_id,
    rank: str | None = None,
    field: str = "created_at",
) -> KeysetPage[T]:
    """One page of `rows`, newest first by `field` (`rank`: highest value of that field first,
    then newest). `older`: the rows older than that cursor; `newer`: the page just newer than it
    (a full page: when fewer than `size` rows are newer, the first page)."""
    fields = [rank, field, "pk"] if rank else [field, "pk"]

    def decode(raw: str | None) -> tuple | None:
        return decode_ranked_cursor(raw, parse_pk) if rank else decode_cursor(raw, parse_pk)

    seek_older = decode(older)
    seek_newer = decode(newer) if seek_older is None else None
    if seek_newer is not None:
        ascending = list(rows.filter(_past(fields, seek_newer, "gt")).order_by(*fields)[: size + 1])
        if len(ascending) <= size:  # this is the first page: show it whole
            return keyset_page(rows, size=size, parse_pk=parse_pk, rank=rank, field=field)
        items = ascending[:size][::-1]
        return KeysetPage(
            items,
            older=encode_cursor(items[-1], rank=rank, field=field),
            newer=encode_cursor(items[0], rank=rank, field=field),
        )
    if seek_older is not None:
        rows = rows.filter(_past(fields, seek_older, "lt"))
    found = list(rows.order_by(*(f"-{name}" for name in fields))[: size + 1])
    items = found[:size]
    page = KeysetPage(items)
    if len(found) > size:
        page.older = encode_cursor(items[-1], rank=rank, field=field)
    if seek_older is not None and items:
        page.newer = encode_cursor(items[0], rank=rank, field=field)
    return page
