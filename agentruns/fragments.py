"""Server-rendered fragments for stream frames: one template source for page and socket."""

from __future__ import annotations

from django.template.loader import render_to_string

from .events import event_payload
from .models import RunEvent

_TEMPLATES = {
    "step.": "agentruns/_event_step.html",
    "run.status": "agentruns/_event_status.html",
    "approval.": "agentruns/_event_approval.html",
    "run.": "agentruns/_event_generic.html",
    "model.superseded": "agentruns/_event_generic.html",
}


def template_for(event_type: str) -> str | None:
    if event_type in _TEMPLATES:
        return _TEMPLATES[event_type]
    for prefix, name in _TEMPLATES.items():
        if prefix.endswith(".") and event_type.startswith(prefix):
            return name
    return None


def render_event(event: RunEvent) -> str | None:
    name = template_for(event.type)
    if name is None:
        return None
    return render_to_string(name, {"event": event, "data": event.data})


def frame_for(event: RunEvent) -> dict:
    frame = event_payload(event)
    frame["html"] = render_event(event)
    return frame
