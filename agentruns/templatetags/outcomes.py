"""A run's outcome for people (registry/outcomes/): its words and its tone's colour.

    {% load outcomes %}
    <span class="chip {{ run|status_class }}">{{ run.status }}</span>
    {% if run.outcome %}<span class="chip {{ run.outcome|outcome_class }}">{{ run.outcome|outcome_label }}</span>{% endif %}

A run that `succeeded` with an outcome whose tone is not positive (a refund rejected, a request
handed over) does not read as a green success: its status chip is plain (`s-ended`) and the
outcome chip says what happened.
"""

from __future__ import annotations

from typing import Any

from django import template

from agentruns.registry import all_agents
from agentruns.registry.outcomes import label, tones

register = template.Library()


def tone_of(outcome: str) -> str:
    return tones(all_agents().values()).get(outcome, "neutral") if outcome else ""


@register.filter
def outcome_label(outcome: str) -> str:
    return label(outcome or "")


@register.filter
def outcome_class(outcome: str) -> str:
    """The outcome chip's class: `outcome-positive`, `-negative`, `-attention`, `-neutral`."""
    tone = tone_of(outcome)
    return f"outcome-{tone}" if tone else ""


@register.filter
def status_class(run: Any) -> str:
    """The status chip's class: `s-<status>`, plain for a success that is no good news."""
    status = getattr(run, "status", "")
    if status == "succeeded" and tone_of(getattr(run, "outcome", "")) not in ("", "positive"):
        return "s-ended"
    return f"s-{status}"
