"""Tool argument validation: the fast path for simple schemas agrees with jsonschema."""

from __future__ import annotations

import itertools

import pytest

from agentruns.registry import Tool, ToolArgumentsError, simple_plan, strict_validator, tool
from agentruns.registry.schemas import simple_valid

SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "description": "the order"},
        "amount_cents": {"type": "integer"},
        "ratio": {"type": "number"},
        "notify": {"type": "boolean"},
    },
    "required": ["order_id", "amount_cents"],
    "additionalProperties": False,
}

VALUES = ["ORD-1", 5, 5.0, 5.5, True, None, [], {}]


def _tool(schema: dict) -> Tool:
    return Tool(name="t", func=lambda ctx, **kw: kw, description="", parameters=schema)


@pytest.mark.parametrize("extra_allowed", [False, True])
def test_fast_path_agrees_with_jsonschema(extra_allowed):
    schema = {**SCHEMA, "additionalProperties": extra_allowed}
    checker = _tool(schema)
    assert simple_plan(schema) is not None
    reference = strict_validator(schema)  # jsonschema, with integers that are integers
    keys = ["order_id", "amount_cents", "ratio", "notify", "other"]
    for chosen in itertools.chain.from_iterable(itertools.combinations(keys, n) for n in range(4)):
        for values in itertools.product(VALUES[:4], repeat=len(chosen)):
            arguments = dict(zip(chosen, values, strict=True))
            expected = reference.is_valid(arguments)
            try:
                checker.validate(arguments)
                ok = True
            except ToolArgumentsError:
                ok = False
            assert ok == expected, arguments


def test_integers_are_strict_on_both_paths():
    simple = _tool(SCHEMA)
    with_bounds = _tool(
        {
            **SCHEMA,
            "properties": {
                **SCHEMA["properties"],
                "amount_cents": {"type": "integer", "minimum": 1},
            },
        }
    )
    for checker in (simple, with_bounds):
        checker.validate({"order_id": "A", "amount_cents": 5})
        for bad in (5.0, True, "5", 5.5):
            with pytest.raises(ToolArgumentsError, match="amount_cents"):
                checker.validate({"order_id": "A", "amount_cents": bad})


BOUNDED = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]+$", "maxLength": 9},
        "note": {"type": "string", "minLength": 2},
        "amount_cents": {"type": "integer", "minimum": 1, "maximum": 1000},
        "ratio": {"type": "number", "minimum": 0.5, "maximum": 2},
    },
    "required": ["order_id"],
    "additionalProperties": False,
}
BOUNDED_VALUES = {
    "order_id": ["ORD-1", "ORD-123456", "ORD-1\n", "ORD-", "xORD-1", "ORD-12345678", 5, None],
    "note": ["", "a", "ab", "é\U0001f600", 3],
    "amount_cents": [0, 1, 1000, 1001, -5, 5.0, True, "5"],
    "ratio": [0.4, 0.5, 2, 2.0001, 1, True, "1"],
}


def test_fast_path_agrees_with_jsonschema_on_bounds():
    """A pattern (ECMA-262's `$`), lengths and limits: the fast path takes exactly what
    jsonschema takes (it consults jsonschema for anything it does not take)."""
    assert simple_plan(BOUNDED) is not None
    reference = strict_validator(BOUNDED)
    plan = simple_plan(BOUNDED)
    for name, values in BOUNDED_VALUES.items():
        for value in values:
            arguments = {"order_id": "ORD-7", name: value}
            assert simple_valid(plan, arguments) == reference.is_valid(arguments), arguments


OPTIONAL = {  # Pydantic's schema of `ticket_id: str | None = None` and a bounded one
    "type": "object",
    "properties": {
        "ticket_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "amount": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]},
    },
    "additionalProperties": False,
}


def test_fast_path_agrees_with_jsonschema_on_optional_arguments():
    plan = simple_plan(OPTIONAL)
    assert plan is not None
    reference = strict_validator(OPTIONAL)
    for name in OPTIONAL["properties"]:
        for value in ["T-1", "", 0, 1, 1.5, True, None, [], {}]:
            arguments = {name: value}
            assert simple_valid(plan, arguments) == reference.is_valid(arguments), arguments


def test_schemas_with_more_keywords_go_to_jsonschema():
    assert (
        simple_plan({**SCHEMA, "properties": {"n": {"type": "integer", "exclusiveMinimum": 1}}})
        is None
    )
    assert (
        simple_plan({**SCHEMA, "properties": {"s": {"type": "string", "format": "uuid"}}}) is None
    )
    assert simple_plan({**SCHEMA, "properties": {"n": {"type": "integer", "minimum": "1"}}}) is None
    assert simple_plan({**SCHEMA, "properties": {"n": {"type": ["integer", "null"]}}}) is None
    for either in (
        [{"type": "null"}, {"type": "null"}],
        [{"type": "string"}, {"type": "integer"}],
        [{"type": "string"}, {"type": "null"}, {"type": "integer"}],
        [{"type": "string", "format": "uuid"}, {"type": "null"}],
    ):
        assert simple_plan({**SCHEMA, "properties": {"n": {"anyOf": either}}}) is None
    assert simple_plan({**SCHEMA, "$schema": "http://json-schema.org/draft-03/schema#"}) is None
    assert simple_plan({"type": "object", "properties": {"tags": {"type": "array"}}}) is None
    limited = _tool({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})
    with pytest.raises(ToolArgumentsError, match="less than the minimum"):
        limited.validate({"n": 0})


def test_declared_tools_get_the_fast_path():
    @tool(name="t_fast_path_probe")
    def probe(ctx, order_id: str, amount_cents: int, note: str = "") -> dict:
        return {}

    from agentruns.registry import get_tool

    registered = get_tool("t_fast_path_probe")
    registered.validate({"order_id": "A", "amount_cents": 1})
    assert registered._simple is not None
    with pytest.raises(ToolArgumentsError, match="amount_cents"):
        registered.validate({"order_id": "A", "amount_cents": "1"})
