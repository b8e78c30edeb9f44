"""JSON schemas of tool arguments: strict validators, the fast check for simple schemas, and
schemas derived from a function's type hints. Used by the registry, the edit policy and the API.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import jsonschema

# how a refusal names what a schema type wants: "'amount_cents' must be an integer"
TYPE_WORDS = {
    "object": "a JSON object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def type_words(kinds: Any) -> str:
    """ "an integer or null" for a schema's `type` (a name or a list of names)."""
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return " or ".join(TYPE_WORDS.get(k, str(k)) for k in kinds if k)


def _strict_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 5.0 as an integer; an amount of 5.0 cents is a model's or a client's
    # mistake, not a value to store, and `true` is never a number
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.lru_cache(maxsize=256)
def _ecma_regex(pattern: str) -> re.Pattern:
    """`pattern` with ECMA-262's `$` (JSON Schema's dialect): the end of the string, where
    Python's `$` also matches before a final newline ("id\n" would pass `^[a-z]+$`)."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char == "$" and not in_class:
            out.append(r"\Z")
        else:
            out.append(char)
    return re.compile("".join(out))


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Any:
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def strict_validator(schema: dict) -> Any:
    """A jsonschema validator for `schema` (its own draft, 2020-12 when it names none) whose
    "integer" takes only integers, whose patterns end where ECMA-262's do (`_ecma_regex`) and
    which checks formats (uuid, date-time, ...)."""
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    base.check_schema(schema)
    strict = jsonschema.validators.extend(
        base,
        validators={"pattern": _ecma_pattern},
        type_checker=base.TYPE_CHECKER.redefine("integer", _strict_integer),
    )
    return strict(schema, format_checker=base.FORMAT_CHECKER)


_SIMPLE_SCHEMA_KEYS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "title",
    "description",
}
_SIMPLE_PROPERTY_KEYS = {"type", "title", "description", "default"}  # default: an annotation
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
# the bounds a simple property may carry, by the types they apply to (what a refund's schema
# has: a pattern, a maximum length, a minimum and a maximum)
_SIMPLE_BOUNDS = {
    "string": {"pattern", "minLength", "maxLength"},
    "integer": {"minimum", "maximum"},
    "number": {"minimum", "maximum"},
}


def _bounded(kind: str, prop: dict) -> Callable[[Any], bool] | None:
    """The check of one property: its type, then its bounds as jsonschema reads them (a
    pattern searched with ECMA-262's `$`, lengths in code points, inclusive limits)."""
    of_type = _TYPE_CHECKS[kind]
    bounds = {key: prop[key] for key in _SIMPLE_BOUNDS.get(kind, ()) if key in prop}
    if not bounds:
        return of_type
    pattern = bounds.get("pattern")
    low, high = bounds.get("minimum"), bounds.get("maximum")
    shortest, longest = bounds.get("minLength"), bounds.get("maxLength")
    limits = (low, high, shortest, longest)
    if pattern is not None and not isinstance(pattern, str):
        return None
    if any(
        x is not None and (isinstance(x, bool) or not isinstance(x, int | float)) for x in limits
    ):
        return None
    try:
        regex = _ecma_regex(pattern) if pattern is not None else None
    except re.error:
        return None  # jsonschema's own words for it

    def check(value: Any) -> bool:
        if not of_type(value):
            return False
        if regex is not None and not regex.search(value):
            return False
        if shortest is not None and len(value) < shortest:
            return False
        if longest is not None and len(value) > longest:
            return False
        if low is not None and value < low:
            return False
        return high is None or value <= high

    return check


def _simple_property(prop: Any) -> Callable[[Any], bool] | None:
    """One property's check: a typed scalar with its bounds, or that or null as Pydantic writes
    an optional argument (`str | None = None`: `anyOf` of the two, a default beside it)."""
    if not isinstance(prop, dict):
        return None
    either = prop.get("anyOf")
    if either is not None:
        if not set(prop) <= _SIMPLE_PROPERTY_KEYS | {"anyOf"} or "type" in prop:
            return None
        if not isinstance(either, list) or len(either) != 2:
            return None
        other = [p for p in either if p != {"type": "null"}]
        inner = _simple_property(other[0]) if len(other) == 1 else None
        if inner is None:
            return None
        return lambda value: value is None or inner(value)
    kind = prop.get("type")
    if not isinstance(kind, str) or kind not in _TYPE_CHECKS:
        return None
    if not set(prop) <= _SIMPLE_PROPERTY_KEYS | _SIMPLE_BOUNDS.get(kind, set()):
        return None
    return _bounded(kind, prop)


def simple_plan(schema: dict) -> tuple[dict, frozenset, bool] | None:
    """For the common schema (an object of typed scalar properties, each maybe null as well,
    with at most a pattern, lengths or limits each, nothing else): what a hand-written check
    needs. jsonschema costs
    ~70 us per call; this a few. None: not simple."""
    if schema.get("type") != "object" or not set(schema) <= _SIMPLE_SCHEMA_KEYS:
        return None
    checks = {}
    for name, prop in (schema.get("properties") or {}).items():
        check = _simple_property(prop)
        if check is None:
            return None
        checks[name] = check
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        return None
    return checks, frozenset(schema.get("required") or ()), extra


def simple_valid(plan: tuple[dict, frozenset, bool], arguments: dict) -> bool:
    checks, required, extra_allowed = plan
    if not required <= arguments.keys():
        return False
    for key, value in arguments.items():
        check = checks.get(key)
        if check is None:
            if not extra_allowed:
                return False
        elif not check(value):
            return False
    return True


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema_for(annotation: Any) -> dict:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            inner = _schema_for(non_null[0])
            if "type" in inner:
                return {**inner, "type": [inner["type"], "null"]}
            return inner
        return {"anyOf": [_schema_for(a) for a in non_null]}
    if annotation is list or origin is list:
        return {"type": "array", "items": _schema_for(args[0])} if args else {"type": "array"}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    return {}


def schema_from_signature(func: Callable[..., Any]) -> dict:
    """JSON schema of a tool's arguments from its type hints (first parameter is the context)."""
    hints = typing.get_type_hints(func)
    params = list(inspect.signature(func).parameters.values())[1:]
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in params:
        prop = _schema_for(hints.get(param.name, Any))
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            prop["default"] = param.default
        properties[param.name] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
