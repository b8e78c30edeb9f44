"""Moments, durations and amounts as people read them on every page (the helpers in
runtime/values/): one filter per job.

    {% load plain %}
    <time datetime="{{ t|iso }}" title="{{ t|moment }}">{{ t|ago }}</time>        "2 min ago"
    {{ t|moment }}                                                                 "Dec 6, 09:14"
    waited {{ item.created_at|lasted:item.decided_at }}                            "40 s"
    {{ cents|money:"USD" }}                                                        "327.32 USD"
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from django import template
from django.utils import timezone

from agentruns.runtime.values.money import format_cents
from agentruns.runtime.values.timestamps import ago_text, between_text, moment_text
from agentruns.runtime.values.timestamps import iso as iso_text
from agentruns.selectors.calls import argument_label

register = template.Library()


@register.filter(expects_localtime=True)
def iso(value: Any) -> str:
    """The moment for a `<time datetime>`: what `date:'c'` gives (ISO 8601 in the server's
    zone), at a fifth of its cost; a page of cards shows a hundred of them."""
    return (iso_text(value) or "") if isinstance(value, date) else ""


@register.filter
def ago(value: datetime | None) -> str:
    return ago_text(value)


@register.filter
def moment(value: datetime | None) -> str:
    return moment_text(value)


@register.filter
def lasted(start: datetime | None, end: datetime | None = None) -> str:
    """From `start` to `end` (to now while there is no end)."""
    return between_text(start, end or timezone.now())


@register.filter
def money(cents: Any, currency: str = "") -> str:
    """Minor units in the currency ("327.32 USD"); anything that is not a number as it is."""
    if isinstance(cents, int | float) and not isinstance(cents, bool):
        return format_cents(cents, currency)
    return "" if cents is None else str(cents)


@register.filter
def field_label(name: str) -> str:
    """An argument or input field as people name it ("order_id" -> "Order")."""
    return argument_label(str(name))
