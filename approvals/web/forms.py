"""The inbox card's decision form: edited arguments typed by the tool's schema (the tool's amount
in its currency, approvals/web/amounts.py), and the version of the proposal the card showed.
Refusals read like the API's (`EditNotAllowed`, field and rule).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, QueryDict

from agentruns.registry import UnknownTool, get_tool
from agentruns.registry.edits import same_value
from agentruns.registry.schemas import type_words
from agentruns.runtime.values.ids import BadId, parse_id
from agentruns.runtime.values.text import UnsafeValue, check_text, loads_strict
from approvals.errors import EditNotAllowed
from approvals.models import Approval
from approvals.web.amounts import amount_from_form

_NOT_PARSED = object()


def _parse_value(name: str, kind: str, raw: str) -> Any:
    """A form field's text as the JSON type the schema wants, by the API's rules (agentruns.runtime.values.text:
    ASCII digits only, finite numbers within 64 bits, strict JSON); refusals read like the API's."""
    if raw == "" and kind not in ("string", "boolean"):
        raise EditNotAllowed(name, "required", f"edit refused: {name}: a value is required")
    if kind in ("integer", "number", "object", "array"):
        try:
            value = loads_strict(raw, name)
        except UnsafeValue:
            value = _NOT_PARSED
        wrong_number = kind in ("integer", "number") and (
            isinstance(value, bool)
            or not isinstance(value, int if kind == "integer" else int | float)
        )
        if value is _NOT_PARSED or wrong_number:
            message = (
                f"edit refused: {name} must be {type_words(kind)} (got {raw})"  # as the API says
            )
            raise EditNotAllowed(name, "type", message)
        return value
    if kind == "boolean":
        return raw in ("1", "true", "on")
    try:
        check_text(raw, name)
    except UnsafeValue as exc:
        raise EditNotAllowed(name, "text", f"edit refused: {exc}") from None
    return raw


def form_args(approval: Approval, post: QueryDict) -> dict | None:
    """Edited arguments from the form generated from the tool's schema: the fields whose value
    differs from the proposal the card showed (what the agent asked for, or an earlier
    approver's edit). Only fields the tool's edit policy declares are in the form; fields the
    tool redacts never are (the approver never saw their values)."""
    try:
        tool = get_tool(approval.tool)
    except UnknownTool:
        return None
    properties = tool.parameters.get("properties", {})
    hidden = set(approval.hidden_fields)
    shown = approval.effective_args
    edited: dict = {}
    for name, prop in properties.items():
        field = f"arg_{name}"
        if name in hidden or (field not in post and f"present_{name}" not in post):
            continue
        kind = prop.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        raw = post.get(field, "").strip()
        if f"unit_{name}" in post and kind == "integer":  # the amount, typed in its currency
            requested = approval.requested_args.get(name)
            unit = post.get(f"unit_{name}", "")
            value = amount_from_form(name, raw, unit, tool.editable.get(name), requested)
        else:
            value = _parse_value(name, kind, raw)
        if name not in shown or not same_value(shown.get(name), value):
            edited[name] = value
    return edited or None


def posted_version(request: HttpRequest) -> int:
    """The version of the proposal the card showed (0, never current, for a form without one:
    the inbox always names what the person saw)."""
    try:
        return parse_id(request.POST.get("version", ""), what="version")
    except BadId:
        return 0
