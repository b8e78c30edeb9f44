"""Redaction of secrets for everything a person or a log sees (never for the model)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
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


def redact_text(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        if pattern.groups:
            text = pattern.sub(lambda m: m.group(1) + MASK, text)
        else:
            text = pattern.sub(MASK, text)
    return text


class RedactingFilter(logging.Filter):
    """Masks tokens and keys in every log record that passes through the console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the logger's problem, not ours
            return True
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
