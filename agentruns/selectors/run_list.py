"""The runs list query: filters, search and keyset pagination (`pagination.py`).

There is deliberately no total count (a COUNT over 100k rows per page view is the thing that
gets slow); the navigation shows capped per-status counts.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db.models import F, Lookup, Q, QuerySet
from django.db.models.lookups import IRegex
from django.utils import timezone

from agentruns.models import Run, RunStatus
from agentruns.registry.search import expanded_keys
from agentruns.selectors.pagination import KeysetPage, keyset_page, parse_uuid
from agentruns.selectors.people import username_lookup
from agentruns.selectors.waiting import KINDS as WAIT_KINDS
from agentruns.selectors.waiting import waiting_on, with_waiting_for

AGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
PAGE_SIZE = 50
LIST_FIELDS = (
    "id",
    "agent",
    "status",
    "error",
    "stop_reason",
    "outcome",
    "step_count",
    "created_at",
    "finished_at",
    "search_text",
    "cancel_requested",
    "lease_owner",  # which worker process holds a running run (`Run.worker`)
    "priority",
    "concurrency_key",
    "waiting_behind",  # a run waiting in its concurrency key's line
)
_HEX = re.compile(r"^[0-9a-f]{1,32}$")
OUTCOME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass
class RunFilters:
    status: str = ""
    outcome: str = ""  # what the work came to (registry/outcomes/)
    agent: str = ""
    age: str = ""
    q: str = ""
    # the API's own filters (the page does not offer them)
    created_by: str = ""  # a username
    created_after: datetime | None = None
    created_before: datetime | None = None
    # a whole search key, exactly (an order or ticket id: "ORD-1001" but not "ORD-10010"), for
    # pages of a domain app that list the runs of one of its objects (support's ticket page)
    key: str = ""
    # what a waiting run waits for (selectors/waiting.py: approval, question, event, timer, ...)
    waiting_for: str = ""

    @classmethod
    def from_query(cls, params: dict) -> RunFilters:
        status = params.get("status", "")
        age = params.get("age", "")
        outcome = params.get("outcome", "")
        waiting = params.get("waiting_for", "")
        return cls(
            waiting_for=waiting if waiting in WAIT_KINDS else "",
            status=status if status in RunStatus.values else "",
            outcome=outcome if OUTCOME.match(outcome) else "",
            agent=params.get("agent", "")[:100],
            age=age if age in AGES else "",
            q=params.get("q", "").strip()[:100],
        )

    def as_params(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


def id_prefix_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """A run id or its prefix (with or without dashes) as an inclusive UUID range: the primary
    key index answers it, where `id::text LIKE 'ab12%'` would scan the table."""
    digits = text.lower().replace("-", "")
    if not _HEX.match(digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def looks_like_run_id(q: str) -> bool:
    """A whole UUID, or 8+ hex digits with a letter in them: order and ticket keys never are."""
    digits = q.lower().replace("-", "")
    if not _HEX.match(digits):
        return False
    return len(digits) == 32 or (len(digits) >= 8 and any(c in "abcdef" for c in digits))


def search_condition(q: str) -> Q:
    """Ticket or order key anywhere in search_text ("ORD-1001 T-1001"), a run id prefix, or
    a key a domain app says `q` stands for (`registry.search`: the demo's customer names).

    A query that looks like a run id is answered by the primary key alone (a range scan of a few
    rows); anything else matches the search keys case-insensitively, plus an id prefix when it
    could be one (all-digit prefixes of 8+ characters).
    """
    bounds = id_prefix_range(q)
    if bounds is not None and looks_like_run_id(q):
        return Q(id__gte=bounds[0], id__lte=bounds[1])
    keys = Q(search_text__istartswith=q) | Q(search_text__icontains=f" {q}")
    if bounds is not None and len(q.replace("-", "")) >= 8:
        keys |= Q(id__gte=bounds[0], id__lte=bounds[1])
    expanded = expanded_keys(q)  # what q stands for in a domain app: a customer's orders
    if expanded:
        keys |= any_key_condition(expanded)
    return keys


class AnyWord(Lookup):
    """`lhs` holds any of the words `rhs` (a list) as a whole word of it, any case.

    On PostgreSQL the words of `lhs` upper-cased, as an array, overlapping the upper-cased
    `rhs`: the GIN index `run_search_words_idx` (migration 0031) answers it for search_text in
    a fraction of a millisecond. The pattern `(^|\\s)(w1|w2|...)(\\s|$)` it stands for cannot
    use an index (pg_trgm gives up on 50 alternatives): a customer's 50 orders cost a regular
    expression on every run, 300-450 ms at 10,000 runs on a loaded machine. Elsewhere (SQLite)
    that pattern. A word holds no whitespace (`any_key_condition` sends the others apart).
    """

    lookup_name = "any_word"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        if not self.rhs:
            raise EmptyResultSet
        words = "|".join(re.escape(word) for word in self.rhs)
        return IRegex(self.lhs, rf"(^|\s)({words})(\s|$)").as_sql(compiler, connection)

    def as_postgresql(self, compiler, connection):
        if not self.rhs:
            raise EmptyResultSet
        lhs, params = self.process_lhs(compiler, connection)
        # the index's own expression, word for word; UPPER of constants is folded when planned,
        # so the planner sees (and estimates) a constant array, upper-cased as the rows are
        words = ", ".join(["UPPER(%s)"] * len(self.rhs))
        sql = f"regexp_split_to_array(UPPER({lhs}::text), '\\s+') && ARRAY[{words}]::text[]"
        return sql, (*params, *self.rhs)


def any_key_condition(keys: list[str]) -> Q:
    """Any of `keys` as a whole word of search_text, any case, in one condition (`AnyWord`:
    one index scan on PostgreSQL). A common name stands for up to 50 orders: a condition of its
    own for each (a LIKE and a pattern) made the runs search by a customer's name take 330 ms
    (p95 450 ms) at 10,000 runs, and so did one pattern for them all. A key with whitespace in
    it (a phrase, never an order's id) is matched as a phrase of whole words."""
    words = [key for key in keys if not any(c.isspace() for c in key)]
    condition = Q(AnyWord(F("search_text"), words))
    for phrase in keys:
        if phrase not in words:
            condition |= _whole_phrase_condition(phrase)
    return condition


def search_key_condition(key: str) -> Q:
    """`key` as a whole word of search_text ("ORD-1001" in "ORD-1001 T-1001 Ada Lovelace", not
    in "ORD-10010"), any case: the words index finds the rows holding it (`AnyWord`)."""
    return any_key_condition([key])


def _whole_phrase_condition(phrase: str) -> Q:
    """`phrase` standing alone in search_text, any case: the trigram index finds the rows
    containing it, the pattern then keeps those where it stands alone."""
    whole_word = rf"(^|\s){re.escape(phrase)}(\s|$)"
    return Q(search_text__icontains=phrase) & Q(search_text__iregex=whole_word)


def filtered_runs(filters: RunFilters, now: datetime | None = None) -> QuerySet[Run]:
    runs = Run.objects.only(*LIST_FIELDS)
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.outcome:
        runs = runs.filter(outcome=filters.outcome)
    if filters.agent:
        runs = runs.filter(agent=filters.agent)
    if filters.age:
        runs = runs.filter(created_at__gte=(now or timezone.now()) - AGES[filters.age])
    if filters.q:
        runs = runs.filter(search_condition(filters.q))
    if filters.key:
        runs = runs.filter(search_key_condition(filters.key))
    if filters.created_by:
        runs = runs.filter(**{username_lookup("created_by"): filters.created_by})
    if filters.created_after:
        runs = runs.filter(created_at__gt=filters.created_after)
    if filters.created_before:
        runs = runs.filter(created_at__lt=filters.created_before)
    if filters.waiting_for:
        runs = runs.filter(waiting_on(filters.waiting_for))
    return with_waiting_for(runs)


def run_page(
    filters: RunFilters,
    *,
    older: str = "",
    newer: str = "",
    size: int = PAGE_SIZE,
    fields: tuple[str, ...] = (),
) -> KeysetPage[Run]:
    """One page of the filtered runs, newest first: one query (`pagination.keyset_page`).
    `fields`: more columns to load (the API's list adds the starter's username, the trace)."""
    runs = filtered_runs(filters)
    if fields:
        runs = runs.select_related("created_by").only(*LIST_FIELDS, *fields)
    return keyset_page(runs, older=older, newer=newer, size=size, parse_pk=parse_uuid)
