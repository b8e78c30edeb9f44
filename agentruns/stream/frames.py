"""Stream frames and the page's first render, from one set of templates and one set of rules.

A frame is `{"seq", "type", "data", "html"}` (DESIGN.md 5; `created_at` rides along as the API
has it). `html` is the event-list fragment the page renders for the same event
(`agentruns/_event.html`), or null for model deltas, which the page shows as conversation text.

The page's first render of the model text is `selectors.live_turns`, by the same rules as the
stream client, so the render and the socket (`after=last_seq`) meet without a gap or a doubled
delta.
"""

from __future__ import annotations

import json
import uuid

from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string

from agentruns.models import RunEvent
from agentruns.runtime.events import event_payload
from agentruns.runtime.values.text import printable

EVENT_TEMPLATE = "agentruns/_event.html"
TEXT_ONLY_TYPES = frozenset({"model.delta"})  # shown as conversation text, not as event lines


def render_event(event: RunEvent) -> str | None:
    if event.type in TEXT_ONLY_TYPES:
        return None
    return render_to_string(EVENT_TEMPLATE, {"event": event})


def frame_for(event: RunEvent) -> dict:
    frame = event_payload(event)
    frame["html"] = render_event(event)
    return frame


def encode_frame(frame: dict) -> str:
    # printable: a stored lone surrogate must not stop the socket (it cannot be sent as UTF-8)
    return printable(
        json.dumps(frame, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":"))
    )


def encoded_frames_after(run_id: uuid.UUID | str, after: int, limit: int) -> list[tuple[int, str]]:
    """(seq, frame JSON) for events with seq > after, in seq order: rendered once, sent to many."""
    events = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    return [(event.seq, encode_frame(frame_for(event))) for event in events]
