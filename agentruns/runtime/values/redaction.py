"""Redaction of secrets for everything a person or a log sees.

Two kinds of secret: the values of the arguments and results a tool names in its `redact` list
(masked by key in structured data, and wherever the same value turns up in free text such as
that step's error or traceback), and anything that looks like a credential (bearer tokens, API
keys: `_SECRET_PATTERNS`) in any free text. The runtime redacts free text when it writes what
only people read (attempt errors and tracebacks, step errors, run errors, events); pages, the
API and the admin redact structured data when they show it; the log filter covers messages and
tracebacks.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

MASK = "••••••"

# bearer tokens, OpenAI-style keys and our own API tokens ("art_...")
_SECRET_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bart_[A-Za-z0-9_\-]{8,}"),
]


def redact_fields(value: Any, fields: Iterable[str]) -> Any:
    """A copy of `value` with every key named in `fields` masked, at any depth."""
    names = set(fields)
    if not names:
        return value
    if isinstance(value, dict):
        return {k: (MASK if k in names else redact_fields(v, names)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_fields(v, names) for v in value]
    return value


# the secret values of the tool call running in this thread: the log filter masks them too
_IN_SCOPE: ContextVar[tuple[str, ...]] = ContextVar("agentruns_secrets_in_scope", default=())


@contextmanager
def secrets_in_scope(values: Iterable[str]) -> Iterator[None]:
    """While a tool runs: whatever it logs has its secret argument values masked."""
    values = tuple(values)
    if not values:
        yield
        return
    token = _IN_SCOPE.set(values + _IN_SCOPE.get())
    try:
        yield
    finally:
        _IN_SCOPE.reset(token)


MIN_SECRET_CHARS = 4  # shorter values ("1", "yes") would mask half of every message


def secret_values(value: Any, fields: Iterable[str]) -> list[str]:
    """The values under the keys named in `fields` (at any depth), as text, longest first."""
    names, found = set(fields), set()

    def walk(node: Any, hidden: bool) -> None:
        if isinstance(node, dict):
            for key, item in node.items():
                walk(item, hidden or key in names)
        elif isinstance(node, list):
            for item in node:
                walk(item, hidden)
        elif hidden and node is not None and not isinstance(node, bool):
            text = node if isinstance(node, str) else json.dumps(node)
            if len(text) >= MIN_SECRET_CHARS:
                found.add(text)

    if names:
        walk(value, False)
    return sorted(found, key=len, reverse=True)


def redact_text(text: str, values: Iterable[str] = ()) -> str:
    """`text` with credentials (by pattern) and the given secret `values` masked."""
    if not text:
        return text
    for secret in values:
        text = text.replace(secret, MASK)
    for pattern in _SECRET_PATTERNS:
        if pattern.groups:
            text = pattern.sub(lambda m: m.group(1) + MASK, text)
        else:
            text = pattern.sub(MASK, text)
    return text


def redact_tool_calls(tool_calls: Any, fields_of: Callable[[str], list[str]]) -> list[dict]:
    """A model step's tool calls as people see them: each call's arguments redacted by its
    tool's `redact` list (`fields_of(tool name)`), credentials masked in any raw text."""
    calls = []
    for call in tool_calls or []:
        if not isinstance(call, dict):
            continue
        name = str(call.get("name", ""))
        raw = call.get("arguments") or "{}"
        try:
            args: Any = json.loads(raw) if isinstance(raw, str) else raw
            shown = json.dumps(
                redact_fields(args, fields_of(name)), ensure_ascii=False, sort_keys=True
            )
        except (json.JSONDecodeError, TypeError, ValueError):
            shown = str(raw)
        calls.append({"name": name, "arguments": redact_text(shown)})
    return calls


class RedactingFilter(logging.Filter):
    """Masks tokens and keys in every log record that passes through the console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the logger's problem, not ours
            return True
        values = _IN_SCOPE.get()
        cleaned = redact_text(message, values)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            # the formatter prints exc_text when it is set: give it the redacted traceback
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, values)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, values)
        return True
