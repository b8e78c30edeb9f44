"""One way to write a moment in JSON: ISO 8601 with the offset, None for no moment."""

from __future__ import annotations

from datetime import date, datetime


def iso(value: datetime | date | None) -> str | None:
    return value.isoformat() if value else None
