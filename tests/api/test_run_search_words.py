"""The runs search's keys as whole words (agentruns/selectors/run_list.py `AnyWord`): the runs of
a customer's orders, and of one order on its ticket page, on PostgreSQL through the words index
(migration 0031) that keeps the search by a customer's name off a scan of every run."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from agentruns.models import Run
from agentruns.selectors.run_list import any_key_condition, search_key_condition

pytestmark = pytest.mark.django_db

TEXTS = [
    "ORD-1001 T-1001",
    "ORD-10010 T-10010",
    "ord-2002 t-2002",
    "x\tORD-3003",
    "ORD-4004 Ada Lovelace",
    "",
]


@pytest.fixture
def runs() -> None:
    for text in TEXTS:
        Run.objects.create(agent="refund", input={}, search_text=text)


def found(condition) -> list[str]:
    return sorted(Run.objects.filter(condition).values_list("search_text", flat=True))


def test_any_key_is_a_whole_word_in_any_case(runs):
    assert found(any_key_condition(["ORD-1001", "ORD-2002"])) == [
        "ORD-1001 T-1001",
        "ord-2002 t-2002",
    ]
    assert found(any_key_condition(["ORD-100", "1001", "T-"])) == []  # never a part of a word
    assert found(any_key_condition(["ORD-3003"])) == ["x\tORD-3003"]  # any whitespace
    assert found(any_key_condition(["ada lovelace"])) == ["ORD-4004 Ada Lovelace"]  # a phrase
    assert found(any_key_condition(["Ada Love"])) == []
    assert found(any_key_condition([])) == []
    assert found(search_key_condition("t-10010")) == ["ORD-10010 T-10010"]
    assert found(search_key_condition("ORD-1001")) == ["ORD-1001 T-1001"]


def test_the_words_index_answers_a_customers_fifty_orders(runs):
    keys = [f"ORD-{n}" for n in range(5000, 5049)] + ["ORD-1001"]
    with transaction.atomic():
        with connection.cursor() as cursor:  # the index can answer it, whatever the planner's
            cursor.execute("SET LOCAL enable_seqscan = off")  # choice at six rows
        plan = Run.objects.filter(any_key_condition(keys)).explain()
        assert found(any_key_condition(keys)) == ["ORD-1001 T-1001"]
    assert "run_search_words_idx" in plan, plan
