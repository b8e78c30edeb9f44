"""Stream frames and the page's first render, from one set of templates and one set of rules.

A frame is `{"seq", "type", "data", "html"}` (DESIGN.md 5; `created_at` rides along as the API
has it). `html` is the event-list fragment the page renders for the same event
(`agentruns/_event.html`), or null for model deltas, which the page shows as conversation text.

`live_turns` rebuilds the conversation text exactly as the stream client does from the frames:
text per (step, attempt), an attempt dropped when a `model.superseded` event names it or when a
newer attempt of the same step starts streaming. Bounded by the run's `last_seq` read with the
page, so the first render and the socket (`after=last_seq`) meet without a gap or a doubled delta.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string

from agentruns.models import RunEvent
from agentruns.runtime.events import event_payload

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
    return json.dumps(frame, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":"))


def encoded_frames_after(run_id: uuid.UUID | str, after: int, limit: int) -> list[tuple[int, str]]:
    """(seq, frame JSON) for events with seq > after, in seq order: rendered once, sent to many."""
    events = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    return [(event.seq, encode_frame(frame_for(event))) for event in events]


@dataclass
class Turn:
    step: int
    attempt: int
    text: str


def live_turns(run_id: uuid.UUID | str, upto_seq: int) -> list[Turn]:
    """The model text in events 1..upto_seq, per (step, attempt), minus dropped attempts."""
    turns: dict[tuple[int, int], list[str]] = {}
    dropped: set[tuple[int, int]] = set()
    newest: dict[int, int] = {}  # step -> newest attempt seen streaming
    rows = (
        RunEvent.objects.filter(
            run_id=run_id, seq__lte=upto_seq, type__in=["model.delta", "model.superseded"]
        )
        .order_by("seq")
        .values_list("type", "data")
    )
    for etype, data in rows:
        key = (int(data.get("step", 0)), int(data.get("attempt", 0)))
        if etype == "model.superseded":
            dropped.add(key)
            continue
        if key in dropped:
            continue
        if key[1] > newest.get(key[0], 0):
            for older in range(1, key[1]):
                dropped.add((key[0], older))
            newest[key[0]] = key[1]
        turns.setdefault(key, []).append(data.get("text", ""))
    return [
        Turn(step=k[0], attempt=k[1], text="".join(parts))
        for k, parts in turns.items()
        if k not in dropped
    ]
