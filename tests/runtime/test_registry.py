"""Tool argument validation: the fast path for simple schemas agrees with jsonschema."""

from __future__ import annotations

import itertools

import pytest

from agentruns.registry import Tool, ToolArgumentsError, simple_plan, strict_validator, tool

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


def test_schemas_with_more_keywords_go_to_jsonschema():
    assert simple_plan({**SCHEMA, "properties": {"n": {"type": "integer", "minimum": 1}}}) is None
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
