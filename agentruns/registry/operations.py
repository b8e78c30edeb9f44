"""What a side-effect tool declares about its calls across runs (DESIGN.md 4.13), read by the
runtime and the inbox (both re-exported by `agentruns.registry`):

    @tool(side_effect=True, idempotency="key",
          operation_key=lambda args: f"refund:{args['order_id']}",
          limit=refund_limit,      # args -> None, or OverLimit(message, figures): over the limit
          context=refund_context)  # args -> a JSON object an approver reads beside the call

- `operation_key`: the call's business key. Across all runs at most one successful execution per
  key (the database's unique constraint decides, `agentruns.models.OperationExecution`); a later
  call is not made and returns the first one's result marked as already done. A lead may allow
  one more execution of a key (a second partial refund).
- `limit`: a rule over what the calls add up to (the refunds of an order against what was paid).
  Checked when a person approves a call (refused with the figures) and right before the call
  runs, while the call holds its operation key, so calls sharing a key are checked one at a time.
- `context`: what an approver needs to see beside the call (the order's other refunds): the
  inbox card and the API item's `context`, with the other pending calls of the same key. It may
  carry `many`, the contexts of a list of calls at once (`contexts_of`): the inbox's page.

Each is a plain function of the call's (final, possibly edited) arguments, so the runtime and
the inbox never import the domain that knows what an order is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

KEY_MAX = 200  # OperationExecution.key's length


class OperationKeyError(ValueError):
    """The tool's `operation_key` gave no usable key for these arguments (the call is refused)."""


@dataclass(frozen=True)
class OverLimit:
    """A tool's `limit` answer for a call that would go over it: the sentence people and the
    model read ("this refund of 120.00 USD would bring the order's refunds to 460.00 of 358.18
    USD paid") and the figures behind it (for scripts: the API's 4xx carries them)."""

    message: str
    figures: dict[str, Any] = field(default_factory=dict)


def check_key(key: Any, *, where: str = "operation key") -> str:
    """`key` if it is a usable operation key: a non-empty printable string of at most KEY_MAX
    characters, without '/' (it is a path segment of /api/operation-keys/<key>) and without
    surrounding spaces. OperationKeyError otherwise."""
    if not isinstance(key, str):
        raise OperationKeyError(f"{where} must be a string, not {type(key).__name__}")
    if not key or len(key) > KEY_MAX or key != key.strip():
        raise OperationKeyError(
            f"{where} must be 1 to {KEY_MAX} characters without surrounding spaces"
        )
    if not key.isprintable() or "/" in key:
        raise OperationKeyError(f"{where} must be printable and hold no '/'")
    return key


def operation_key_of(tool: str, declared: Callable[[dict], Any], arguments: dict) -> str:
    """The operation key `declared` gives these arguments, checked (OperationKeyError)."""
    try:
        key = declared(arguments)
    except Exception as exc:  # the declaration's own failure: the call is refused, not crashed
        raise OperationKeyError(
            f"{tool}: its operation_key could not be computed from the arguments "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return check_key(key, where=f"{tool}: its operation_key")


def over_limit(tool: str, declared: Callable[[dict], Any], arguments: dict) -> OverLimit | None:
    """What `declared` (a tool's `limit`) says of these arguments: None within the limit, else
    OverLimit (a bare message is one). The callable's own exceptions reach the caller, which
    tells an outage from a verdict; an answer of another kind fails closed."""
    answer = declared(arguments)
    if answer is None or answer is False:
        return None
    if isinstance(answer, OverLimit):
        return answer
    if isinstance(answer, str) and answer:
        return OverLimit(answer)
    return OverLimit(f"{tool}: its limit answered {type(answer).__name__}, not None or OverLimit")


def context_of(tool: str, declared: Callable[[dict], Any], arguments: dict) -> dict:
    """What `declared` (a tool's `context`) gives an approver for these arguments, as plain JSON
    (an object). Its failure is shown in place, never breaking the inbox."""
    try:
        value = declared(arguments)
    except Exception as exc:
        return _context_error(tool, exc)
    return _plain_context(tool, value)


def contexts_of(tool: str, declared: Callable[[dict], Any], calls: list[dict]) -> list[dict]:
    """`context_of` of each of these calls of one tool, in order. A declaration may read many
    calls at once: a `many` attribute, a function of a list of arguments answering their
    contexts in the same order (the inbox reads a page of cards so, in the queries of one
    instead of one card's each). When it fails, or answers another number of contexts, each
    call is read alone: one bad call still shows its own error, never breaking the others."""
    many = getattr(declared, "many", None)
    if callable(many) and calls:
        try:
            values = list(many(calls))
        except Exception:
            log.warning(
                "%s: its context.many failed; reading the calls one by one", tool, exc_info=True
            )
        else:
            if len(values) == len(calls):
                return [_plain_context(tool, value) for value in values]
            log.warning("%s: its context.many answered %d for %d", tool, len(values), len(calls))
    return [context_of(tool, declared, arguments) for arguments in calls]


def _plain_context(tool: str, value: Any) -> dict:
    try:
        value = json.loads(json.dumps(value, default=str))
    except Exception as exc:
        return _context_error(tool, exc)
    if not isinstance(value, dict):
        return {"error": f"{tool}: its context must be a JSON object, not {type(value).__name__}"}
    return value


def _context_error(tool: str, exc: Exception) -> dict:
    return {"error": f"{tool}: its context could not be built ({type(exc).__name__}: {exc})"}
