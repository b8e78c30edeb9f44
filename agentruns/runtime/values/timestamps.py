"""Moments and durations, one way each: ISO 8601 with the offset in JSON (`iso`), and as people
read them on pages, in mails and in the notes an agent writes (`moment_text`: "Dec 6, 09:14";
`ago_text`: "2 min ago"; `duration_text`: "40 s", "7 min"). Pages use them through the
`plain` template filters (agentruns/templatetags/plain.py); people read the server's time zone
(`TIME_ZONE`), the `<time datetime>` around them keeps the exact moment for machines.
"""

from __future__ import annotations

from datetime import date, datetime

from django.utils import timezone

MINUTE, HOUR, DAY = 60, 3600, 86400


def iso(value: datetime | date | None) -> str | None:
    return value.isoformat() if value else None


def parse_moment(value: datetime | str | None) -> datetime | None:
    """A moment from a datetime or its ISO 8601 text (as a tool result stores it); None for
    anything else. A naive one is taken to be UTC."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if timezone.is_aware(value) else value.replace(tzinfo=timezone.utc)


def moment_text(value: datetime | str | None, now: datetime | None = None) -> str:
    """ "Dec 6, 09:14" in the server's time zone ("Dec 6 2025, 09:14" in another year); "" for
    no moment."""
    moment = parse_moment(value)
    if moment is None:
        return ""
    # the zone read once (each `timezone.localtime` reads it again): a page of 50 rows shows
    # 100 moments, and this ran at 50 us each
    zone = timezone.get_current_timezone()
    local = moment.astimezone(zone)
    this_year = (now or timezone.now()).astimezone(zone).year
    year = "" if local.year == this_year else f" {local.year}"
    return f"{local:%b} {local.day}{year}, {local.hour:02d}:{local.minute:02d}"


def ago_text(value: datetime | str | None, now: datetime | None = None) -> str:
    """How long ago, in a glance: "just now", "2 min ago", "3 h ago"; older than a day (or in
    the future) the moment itself ("Dec 6, 09:14")."""
    moment = parse_moment(value)
    if moment is None:
        return ""
    now = now or timezone.now()
    seconds = (now - moment).total_seconds()
    if seconds < -MINUTE or seconds >= DAY:
        return moment_text(moment, now)
    if seconds < MINUTE:
        return "just now"
    if seconds < HOUR:
        return f"{int(seconds // MINUTE)} min ago"
    return f"{int(seconds // HOUR)} h ago"


def duration_text(seconds: float | None) -> str:
    """A duration as people say it: "40 s", "7 min", "2 h 5 min", "3 days"; "" for none."""
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    if seconds < MINUTE:
        return f"{seconds} s"
    if seconds < HOUR:
        return f"{seconds // MINUTE} min"
    if seconds < DAY:
        hours, minutes = divmod(seconds // MINUTE, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days = seconds // DAY
    return f"{days} day{'s' if days != 1 else ''}"


def between_text(start: datetime | None, end: datetime | None) -> str:
    """How long from `start` to `end` (a decided item's wait: created to decided)."""
    if start is None or end is None:
        return ""
    return duration_text((end - start).total_seconds())
