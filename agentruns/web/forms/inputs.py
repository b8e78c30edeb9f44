"""The start form's fields, generated from an agent's `input_schema`, and the input they post.

Strings, integers, numbers, booleans and enums are form controls (a long or unbounded string is
a text area); required properties are marked and required by the browser; `maxLength`,
`minLength`, `pattern`, `minimum` and `maximum` become the input's own bounds. A property of any
other type (an object, an array) is a small JSON box of its own. The posted values are turned
back into the input the schema describes; the agent's schema then validates it in
`services.start_run`, as for every door.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentruns.runtime.values.text import UnsafeValue, loads_strict

PREFIX = "in_"  # the form's field names: apart from `agent`, `input` and the form token
LONG_TEXT = 120  # a string allowed to be longer than this is a text area
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


@dataclass
class InputField:
    name: str
    kind: str  # text | textarea | integer | number | boolean | choice | json
    required: bool
    value: Any = ""
    description: str = ""
    choices: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def form_name(self) -> str:
        return PREFIX + self.name

    @property
    def checked(self) -> bool:
        return self.value in (True, "true", "on", "1")


def string_attrs(prop: Mapping[str, Any]) -> dict[str, Any]:
    """A string property's bounds as the HTML input's own (the browser checks them first)."""
    html = {"maxLength": "maxlength", "minLength": "minlength", "pattern": "pattern"}
    return {attr: prop[key] for key, attr in html.items() if key in prop}


def _type(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type", "string")
    if isinstance(kind, list):  # ["integer", "null"]: the non-null type
        kind = next((k for k in kind if k != "null"), "string")
    return str(kind)


def _field(name: str, prop: Mapping[str, Any], required: bool, value: Any) -> InputField:
    kind = _type(prop)
    attrs: dict[str, Any] = {}
    shown = "" if value is None else value
    if "enum" in prop:
        choices = [str(c) for c in prop["enum"]]
        return InputField(
            name, "choice", required, str(shown), prop.get("description", ""), choices
        )
    if kind == "string":
        attrs.update(string_attrs(prop))
        long = int(prop.get("maxLength") or 10**9) > LONG_TEXT
        kind = "textarea" if long else "text"
    elif kind in ("integer", "number"):
        attrs["step"] = "1" if kind == "integer" else "any"
        for key, attr in (("minimum", "min"), ("maximum", "max")):
            if key in prop:
                attrs[attr] = prop[key]
    elif kind == "boolean":
        pass
    else:
        kind = "json"
    return InputField(name, kind, required, shown, str(prop.get("description", "")), attrs=attrs)


def input_fields(schema: Mapping[str, Any] | None, values: Mapping[str, Any] | None = None):
    """The fields of `schema`'s properties (required ones first), filled from `values` (a
    posted form by field name, or initial values by property name)."""
    if not schema or not isinstance(schema.get("properties"), Mapping):
        return []
    values = values or {}
    required = set(schema.get("required") or [])
    props = schema["properties"]
    order = sorted(props, key=lambda n: (n not in required, list(props).index(n)))
    fields = []
    for name in order:
        prop = props[name] if isinstance(props[name], Mapping) else {}
        value = values.get(PREFIX + name, values.get(name, prop.get("default", "")))
        fields.append(_field(name, prop, name in required, value))
    return fields


def _parse(f: InputField, raw: str) -> Any:
    if f.kind == "integer":
        if not _INTEGER.match(raw):
            raise ValueError(f"{f.name}: a whole number, not {raw[:40]!r}")
        return int(raw)
    if f.kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise ValueError(f"{f.name}: a number, not {raw[:40]!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{f.name}: a finite number")
        return int(number) if number.is_integer() and "." not in raw else number
    if f.kind == "json":
        try:
            return loads_strict(raw, f.name)
        except UnsafeValue as exc:
            raise ValueError(f"{f.name}: not valid JSON ({exc})") from None
    return raw


def input_from_form(schema: Mapping[str, Any] | None, posted: Mapping[str, Any]) -> dict:
    """The run input the form's fields describe (ValueError naming the field when one is not
    what its type needs). An empty optional field is left out, as if never given."""
    run_input: dict[str, Any] = {}
    for f in input_fields(schema):
        if f.kind == "boolean":
            run_input[f.name] = bool(posted.get(f.form_name))
            continue
        raw = str(posted.get(f.form_name, ""))
        if f.kind != "textarea":
            raw = raw.strip()
        if raw == "":
            if f.required:
                raise ValueError(f"{f.name} is required")
            continue
        if f.kind == "choice":
            by_text = {str(c): c for c in (schema or {})["properties"][f.name]["enum"]}
            if raw not in by_text:
                raise ValueError(f"{f.name}: one of {', '.join(by_text)}")
            run_input[f.name] = by_text[raw]
            continue
        run_input[f.name] = _parse(f, raw)
    return run_input
