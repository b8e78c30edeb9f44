"""The run detail's step table and its compact SVG timeline (server-rendered)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .models import Run, Step
from .redaction import redact_fields
from .serializers import redact_for

COLOURS = {
    "succeeded": "#2f855a",
    "failed": "#c53030",
    "retrying": "#dd6b20",
    "crashed": "#9b2c2c",
    "unknown": "#6b46c1",
    "running": "#2b6cb0",
}


@dataclass
class StepView:
    step: Step
    arguments: str
    result: str
    attempts: list
    approval: Any
    retry_policy: dict | None


def _pretty(value: Any) -> str:
    if value in (None, {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def view_steps(run: Run, steps: list[Step]) -> list[StepView]:
    rows = []
    for step in steps:
        hidden = redact_for(run, step.tool) if step.tool else []
        policy = run.tool_snapshot.get(step.tool, {}).get("retry") if step.tool else None
        rows.append(
            StepView(
                step=step,
                arguments=_pretty(redact_fields(step.arguments, hidden)),
                result=_pretty(redact_fields(step.result, hidden)),
                attempts=list(step.attempt_rows.all()),
                approval=getattr(step, "approval", None) if hasattr(step, "approval") else None,
                retry_policy=policy,
            )
        )
    return rows


def timeline_svg(run: Run, steps: list[Step], width: int = 720, row: int = 14) -> SafeString:
    """One bar per attempt, on one row per step, coloured by outcome."""
    spans = [
        (step, a) for step in steps for a in step.attempt_rows.all()
    ]
    if not spans:
        return mark_safe("")
    start = min(a.started_at for _, a in spans)
    now = timezone.now()
    end = max((a.finished_at or now) for _, a in spans)
    total = max((end - start).total_seconds(), 0.001)
    label_w = 150
    scale = (width - label_w - 10) / total
    height = row * len(steps) + 20
    parts = [
        f'<svg class="timeline" role="img" aria-label="step timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, step in enumerate(steps):
        y = i * row + 2
        label = f"#{step.index} {step.tool or 'model'}"
        parts.append(f'<text x="0" y="{y + row - 4}" font-size="10">{escape(label)}</text>')
        for attempt in step.attempt_rows.all():
            x = label_w + (attempt.started_at - start).total_seconds() * scale
            w = max(2.0, ((attempt.finished_at or now) - attempt.started_at).total_seconds() * scale)
            colour = COLOURS.get(attempt.outcome, "#718096")
            dur = attempt.duration_seconds
            tip = f"{label} attempt {attempt.number}: {attempt.outcome}" + (f", {dur * 1000:.0f} ms" if dur is not None else "")
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{colour}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    parts.append(
        f'<text x="{label_w}" y="{height - 4}" font-size="9" fill="#718096">0 s</text>'
        f'<text x="{width - 60}" y="{height - 4}" font-size="9" fill="#718096">{total:.2f} s</text></svg>'
    )
    return mark_safe("".join(parts))
