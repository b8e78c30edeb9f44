"""Property tests of the request parser (`api/parsing.py` over `agentruns/runtime/values/text.py`): whatever
hostile text or number a body holds, the parser either returns JSON that PostgreSQL stores and
UTF-8 encodes, or refuses it with a 4xx BadRequest naming the problem; never anything else."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentruns.api.parsing import INT_LIMIT, MAX_DEPTH, BadRequest, loads
from agentruns.runtime.values.text import (
    UnsafeValue,
    _plainly_safe,
    _refuse_unsafe,
    printable,
    storable,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

HOSTILE_CHARS = st.sampled_from(["\x00", "\ud800", "\udfff", "\ufffe", "\u202e", "é", "💥", "\n"])
HOSTILE_TEXT = st.lists(st.one_of(HOSTILE_CHARS, st.text(max_size=5)), max_size=8).map("".join)
NUMBER_TEXT = st.one_of(
    st.integers().map(str),
    st.integers(min_value=2**63 - 10, max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "1e-999"]),
)
JSON_LEAF = st.one_of(st.none(), st.booleans(), HOSTILE_TEXT, st.integers(), st.floats())
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(HOSTILE_TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


def _storable(value, bounded: bool = True) -> None:
    """What PostgreSQL's jsonb and any UTF-8 output accept (`bounded`: and a bigint column)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # no lone surrogate
    assert "\x00" not in text
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        assert not bounded or abs(value) <= INT_LIMIT
    elif isinstance(value, float):
        assert math.isfinite(value)
    elif isinstance(value, dict):
        for item in value.values():
            _storable(item, bounded)
    elif isinstance(value, list):
        for item in value:
            _storable(item, bounded)


def _parse(raw: str | bytes):
    try:
        return True, loads(raw)
    except BadRequest as exc:
        assert 400 <= exc.status < 500 and str(exc)
        return False, None


@SETTINGS
@given(JSON_VALUE)
def test_any_json_document_is_parsed_storable_or_refused(value):
    raw = json.dumps({"input": value})  # ensure_ascii: surrogates and NUL as \\u escapes
    ok, parsed = _parse(raw)
    if ok:
        _storable(parsed)


@SETTINGS
@given(NUMBER_TEXT, HOSTILE_TEXT)
def test_hostile_numbers_are_bounded_or_refused(number, key):
    ok, parsed = _parse('{"n": ' + number + ", " + json.dumps(key) + ": 1}")
    if ok:
        _storable(parsed)


@SETTINGS
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_anything_but_a_refusal(raw):
    ok, parsed = _parse(raw)
    if ok:
        _storable(parsed)


@SETTINGS
@given(st.integers(min_value=1, max_value=5000))
def test_nesting_is_bounded(depth):
    # the outermost list is level 0, so MAX_DEPTH + 1 brackets are the deepest allowed
    ok, _ = _parse("[" * depth + "]" * depth)
    assert ok == (depth <= MAX_DEPTH + 1)


@SETTINGS
@given(JSON_VALUE)
def test_storable_and_printable_repair_what_the_runtime_cannot_refuse(value):
    _storable(storable(value), bounded=False)  # jsonb holds any integer
    printable(json.dumps(value, ensure_ascii=False)).encode("utf-8")


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@SETTINGS
@given(st.one_of(JSON_VALUE, st.integers(min_value=1, max_value=40).map(_nested)))
def test_the_quick_check_and_the_one_naming_the_item_agree(value):
    # check_value walks plain values without naming each item, and names it only to refuse
    quick = _plainly_safe(value, 0)
    try:
        _refuse_unsafe(value, "body", 0)
        named = True
    except UnsafeValue as exc:
        named = False
        assert str(exc).startswith("body")
    assert quick == named
