"""What an approver may change in a tool call, and how: a tool's edit policy (DESIGN.md 4.6).

    @tool(..., editable={"amount_cents": Edit.at_most_requested(minimum=1), "reason": Edit.free()})

Nothing is editable unless declared: an argument without an `Edit` is fixed. An edit is checked
field by field against what the agent requested, with strict JSON types (an integer takes no 5.0
and no `true`; a value never silently "equals" another of a different type), then the bound of
its rule, then the tool's whole schema. A refusal names the field and the rule it broke.

Part of the public plug-in API (re-exported by `agentruns.registry`); it knows no domain: a
refund's "amount may only go down" is `Edit.at_most_requested` on whatever the tool calls it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from agentruns.registry.schemas import strict_validator, type_words

EditRule = Literal["free", "at_most_requested", "at_least_requested"]
NUMERIC = ("integer", "number")


@dataclass(frozen=True)
class Edit:
    """How an approver may change one argument."""

    rule: EditRule = "free"
    minimum: float | None = None
    maximum: float | None = None

    @classmethod
    def free(cls) -> Edit:
        """Any value the tool's schema accepts."""
        return cls("free")

    @classmethod
    def at_most_requested(cls, minimum: float | None = None) -> Edit:
        """A number that may only go down from what was requested (and not below `minimum`)."""
        return cls("at_most_requested", minimum=minimum)

    @classmethod
    def at_least_requested(cls, maximum: float | None = None) -> Edit:
        """A number that may only go up from what was requested (and not above `maximum`)."""
        return cls("at_least_requested", maximum=maximum)

    @property
    def bounded(self) -> bool:
        return self.rule != "free"

    def describe(self) -> dict:
        """For the run's snapshot and the API."""
        out: dict[str, Any] = {"rule": self.rule}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def limits(self, requested: Any) -> tuple[float | None, float | None]:
        """(lowest, highest) value this rule allows for an argument requested as `requested`."""
        low, high = self.minimum, self.maximum
        if self.rule == "at_most_requested" and _is_number(requested):
            high = requested if high is None else min(high, requested)
        if self.rule == "at_least_requested" and _is_number(requested):
            low = requested if low is None else max(low, requested)
        return low, high

    def human(
        self, requested: Any, show: Callable[[Any], str] | None = None, unit: str = ""
    ) -> str:
        """The rule in words, for the inbox form: "from 1 up to 4599 (the requested value)";
        `show` writes a bound (an amount in its currency: "45.99") and `unit` follows the
        last one ("from 0.01 up to 45.99 USD")."""
        if self.rule == "free":
            return "may be changed"
        show = show or _num
        unit = f" {unit}" if unit else ""
        low, high = self.limits(requested)
        if self.rule == "at_most_requested":
            floor = f"from {show(low)} " if low is not None else ""
            return f"may only be lowered: {floor}up to {show(high)}{unit} (the requested value)"
        if high is None:
            return f"may only be raised: from {show(low)}{unit} (the requested value)"
        return (
            f"may only be raised: from {show(low)} (the requested value) up to {show(high)}{unit}"
        )


class EditRefused(ValueError):
    """An approver's edit breaks the tool's edit policy or schema: nothing was recorded."""

    def __init__(self, field: str, rule: str, message: str) -> None:
        super().__init__(message)
        self.field, self.rule = field, rule


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def same_value(a: Any, b: Any) -> bool:
    """Equal as JSON: 5 and 5.0 differ, and so do 1 and true (Python says both are equal)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def changed_fields(requested: Mapping[str, Any], proposed: Mapping[str, Any]) -> list[str]:
    """The argument names whose values differ (one side missing counts as a change)."""
    return [
        k
        for k in sorted(set(requested) | set(proposed))
        if (k in requested) != (k in proposed) or not same_value(requested.get(k), proposed.get(k))
    ]


def _type_error(field: str, schema: dict, value: Any) -> str:
    return f"{field} must be {type_words(schema.get('type'))} (got {json.dumps(value)})"


def check_edit(
    parameters: dict,
    editable: Mapping[str, Edit],
    requested: Mapping[str, Any],
    proposed: Mapping[str, Any],
) -> None:
    """Raise EditRefused for the first changed field the policy does not allow (by name order)."""
    properties = parameters.get("properties", {})
    for name in changed_fields(requested, proposed):
        edit = editable.get(name)
        if name not in properties:
            raise EditRefused(name, "unknown", f"{name} is not an argument of this tool")
        if edit is None:
            raise EditRefused(name, "fixed", f"{name} may not be changed: the tool fixes it")
        value = proposed.get(name)
        if name not in proposed or (value is None and None not in _types(properties.get(name))):
            raise EditRefused(name, "required", f"{name}: a value is required")
        schema = properties.get(name, {})
        error = jsonschema.exceptions.best_match(strict_validator(schema).iter_errors(value))
        if error is not None and error.validator == "type":
            raise EditRefused(name, "type", _type_error(name, schema, value))
        low, high = edit.limits(requested.get(name))
        rule_words = edit.human(requested.get(name))
        if _is_number(value) and low is not None and value < low:
            rule = "minimum" if edit.rule != "at_least_requested" else edit.rule
            raise EditRefused(name, rule, f"{name} must be at least {_num(low)} ({rule_words})")
        if _is_number(value) and high is not None and value > high:
            rule = "maximum" if edit.rule != "at_most_requested" else edit.rule
            raise EditRefused(name, rule, f"{name} must be at most {_num(high)} ({rule_words})")
        if error is not None:
            raise EditRefused(name, str(error.validator), f"{name}: {error.message}")


def _types(schema: dict | None) -> list:
    kinds = (schema or {}).get("type")
    if kinds is None:
        return [None]  # untyped: anything goes, null included
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return [None if k == "null" else k for k in kinds]


def check_declaration(
    tool_name: str,
    parameters: dict,
    editable: Mapping[str, Edit],
    redact: tuple[str, ...],
    amount_arg: str | None,
    currency_arg: str | None = None,
) -> None:
    """At registration: an edit policy, an amount argument and a currency argument must name
    real, fitting fields."""
    properties = parameters.get("properties", {})
    for name, edit in editable.items():
        if not isinstance(edit, Edit):
            raise ValueError(f"{tool_name}: editable[{name!r}] must be an Edit")
        if name not in properties:
            raise ValueError(f"{tool_name}: editable names {name!r}, which is not an argument")
        if name in redact:
            raise ValueError(f"{tool_name}: {name!r} is redacted, so no approver can edit it")
        if edit.bounded and not set(_types(properties[name])) & set(NUMERIC):
            raise ValueError(
                f"{tool_name}: {name!r} is not a number, so {edit.rule} cannot bound it"
            )
    if amount_arg is not None and not set(_types(properties.get(amount_arg))) & set(NUMERIC):
        raise ValueError(f"{tool_name}: amount_arg {amount_arg!r} must be a number argument")
    if currency_arg is not None and "string" not in _types(properties.get(currency_arg)):
        raise ValueError(f"{tool_name}: currency_arg {currency_arg!r} must be a string argument")
