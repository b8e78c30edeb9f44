"""One way to write a moment in JSON (ISO 8601 with the offset, None for no moment), and one way to
write it in a sentence people read (`moment_text`)."""

from __future__ import annotations

from datetime import date, datetime

from django.utils import timezone


def iso(value: datetime | date | None) -> str | None:
    return value.isoformat() if value else None


def moment_text(value: datetime | str | None, now: datetime | None = None) -> str:
    """A moment as people read it in a sentence, in the site's time zone: "Dec 6, 09:14" (with
    the year when it is not this year's: "Dec 6 2025, 09:14"); an ISO 8601 string is read
    first (what tool results carry). "" for no moment or one that is not a time."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return ""
    if not isinstance(value, datetime):
        return ""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    today = timezone.localtime(now) if now is not None else timezone.localtime()
    day = f"{value:%b} {value.day}"
    if value.year != today.year:
        day += f" {value.year}"
    return f"{day}, {value:%H:%M}"
