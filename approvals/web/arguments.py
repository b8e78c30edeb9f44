"""A call's arguments on its card: the edit form's inputs, generated from the tool's JSON schema
and bounded by its edit policy (the amount typed in its currency), the table of the proposal with
what an approver changed, and an edit's changes as people read them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from agentruns.runtime.values.money import major_text
from agentruns.selectors.calls import argument_label, deployed_tool
from agentruns.web.forms.inputs import string_attrs
from approvals.models import Approval
from approvals.web.amounts import Money


@dataclass
class FormField:
    """One input of the edit form, generated from the tool's JSON schema."""

    name: str
    type: str
    value: Any
    editable: bool
    required: bool
    attrs: dict = field(default_factory=dict)
    choices: list = field(default_factory=list)
    hint: str = ""  # the edit policy in words ("may only be lowered: from 1 up to 4599 ...")
    # the tool's amount, shown and typed in this currency's major unit ("12.50")
    currency: str = ""

    # read several times a card (the label, the input, its data-original): computed once
    @cached_property
    def label(self) -> str:
        return argument_label(self.name)

    @cached_property
    def input_value(self) -> str:
        if self.type in ("object", "array"):
            return json.dumps(self.value, ensure_ascii=False)
        if self.value is None:
            return ""
        if self.currency and isinstance(self.value, int):
            return major_text(self.value)  # typed in the currency: "12.50"
        return str(self.value)


@dataclass
class ArgRow:
    """One argument in the card's table: the current proposal's value (an amount also in its
    currency) and, when an approver changed it, what the agent asked for."""

    name: str
    value: Any
    shown: str = ""  # an amount in its currency ("120.00 USD")
    asked: str = ""  # edited: the agent's value as shown

    @property
    def label(self) -> str:
        return argument_label(self.name)


def schema_fields(
    approval: Approval, args: dict, hidden: Iterable[str], money: Money | None = None
) -> list[FormField]:
    """The form's inputs for `args` (the current proposal, redacted): editable are the fields
    the tool's edit policy declares (and the approver can see), bounded by their rule. The
    tool's amount (`money`) is shown, bounded and typed in its currency."""
    tool = deployed_tool(approval.tool)
    if tool is None:
        return []
    schema = tool.parameters
    hidden = set(hidden)
    required = set(schema.get("required", []))
    fields = []
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type", "string")
        if isinstance(kind, list):  # ["integer", "null"]: edit as the non-null type
            kind = next((k for k in kind if k != "null"), "string")
        attrs: dict[str, Any] = {}
        edit = tool.editable.get(name)
        requested = approval.requested_args.get(name)
        in_currency = money is not None and money.arg == name and kind == "integer"
        if in_currency:
            low, high = edit.limits(requested) if edit is not None else (None, None)
            low = max((v for v in (prop.get("minimum"), low) if v is not None), default=None)
            high = min((v for v in (prop.get("maximum"), high) if v is not None), default=None)
            attrs = money.field_attrs(low, high)
        elif kind in ("integer", "number"):
            attrs["step"] = "1" if kind == "integer" else "any"
            low, high = prop.get("minimum"), prop.get("maximum")
            if edit is not None:  # the edit policy's bound, where it is tighter than the schema
                bound_low, bound_high = edit.limits(approval.requested_args.get(name))
                low = max((v for v in (low, bound_low) if v is not None), default=None)
                high = min((v for v in (high, bound_high) if v is not None), default=None)
            attrs.update({k: v for k, v in (("min", low), ("max", high)) if v is not None})
        if kind == "string":
            attrs.update(string_attrs(prop))
        fields.append(
            FormField(
                name=name,
                type=kind,
                value=args.get(name, prop.get("default", "")),
                editable=name not in hidden and edit is not None,
                required=name in required,
                attrs=attrs,
                choices=list(prop.get("enum", [])),
                hint=_hint(edit, requested, money if in_currency else None),
                currency=money.currency if in_currency and money is not None else "",
            )
        )
    return fields


def _hint(edit: Any, requested: Any, money: Money | None) -> str:
    if edit is None:
        return ""
    return money.hint(edit, requested) if money is not None else edit.human(requested)


def arg_rows(requested: dict, proposal: dict, money: Money | None) -> list[ArgRow]:
    """The table's rows: the proposal, an amount also in its currency, changes marked."""
    rows = []
    for name in dict.fromkeys([*requested, *proposal]):
        value = proposal.get(name)
        is_money = money is not None and money.arg == name
        row = ArgRow(name, value, shown=money.show(value) if is_money else "")
        if name in requested and not _same(requested.get(name), value):
            asked = requested.get(name)
            row.asked = money.show(asked) if is_money else json.dumps(asked, ensure_ascii=False)
        rows.append(row)
    return rows


def shown_diff(diff: dict, money: Money | None) -> dict:
    """An edit's changes as people read them: the amount in its currency."""
    if money is None or money.arg not in diff:
        return diff
    change = diff[money.arg]
    return {**diff, money.arg: {"from": money.show(change["from"]), "to": money.show(change["to"])}}


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
