"""The run detail's step rows and its compact SVG timeline (both server-rendered).

Everything a person sees here goes through redaction: tool arguments and results by the tool's
`redact` list as frozen in the run's tool snapshot (not the current code's, which may differ),
errors and tracebacks by the secret patterns of `redaction.redact_text`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from agentruns.models import Run, Step, StepAttempt, StepKind, StepStatus
from agentruns.registry.deployed import cannot_run
from agentruns.runtime.values.redaction import redact_fields, redact_text, redact_tool_calls
from agentruns.selectors.calls import call_in_words, facts

# outcome -> colour, shared by the SVG bars and its legend
COLOURS = {
    "succeeded": "#2f855a",
    "failed": "#c53030",
    "retrying": "#dd6b20",
    "crashed": "#9b2c2c",
    "unknown": "#6b46c1",
    "running": "#2b6cb0",
}
# step states with no attempt bar: drawn as a marker at the step's creation
MARKERS = {
    "pending": "#a0aec0",
    "waiting_approval": "#d69e2e",
    "skipped": "#cbd5e0",
    "rejected": "#c53030",
    "failed": "#c53030",
}


@dataclass
class AttemptView:
    attempt: StepAttempt
    error: str
    traceback: str

    def __getattr__(self, name: str) -> Any:  # number, worker, started_at, outcome, ...
        return getattr(self.attempt, name)


@dataclass
class RetryView:
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    jitter: float
    retry_on: list[str]
    attempts_left: int


@dataclass
class StepView:
    step: Step
    arguments: str
    result: str
    error: str
    attempts: list[AttemptView]
    approval: Any
    policy: dict
    retry: RetryView | None
    tool_calls: list[dict] = field(default_factory=list)
    retry_in_seconds: float | None = None
    # a parked call the deployed code cannot run (its tool or agent gone, its schema changed)
    cannot_run: str = ""
    # a tool call in words ("refund 327.32 USD to Jun Sato": selectors/calls.py)
    words: str = ""

    @property
    def side_effect(self) -> bool:
        return bool(self.policy.get("side_effect"))

    @property
    def attempts_counted(self) -> int:
        """Attempts since the last manual retry: what the retry policy's budget counts."""
        return max(0, self.step.attempts - self.step.retry_base)


def pretty_json(value: Any) -> str:
    if value is None or value == {} or value == []:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _retry_view(policy: dict, step: Step) -> RetryView | None:
    retry = policy.get("retry")
    if not retry:
        return None
    max_attempts = int(retry.get("max_attempts", 1))
    return RetryView(
        max_attempts=max_attempts,
        backoff_seconds=float(retry.get("backoff_seconds", 0)),
        backoff_max_seconds=float(retry.get("backoff_max_seconds", 0)),
        jitter=float(retry.get("jitter", 0)),
        retry_on=list(retry.get("retry_on", [])),
        # the budget counts from the last manual retry (`retry_base`), as the executor does
        attempts_left=max(0, max_attempts - (step.attempts - step.retry_base)),
    )


def view_steps(run: Run, steps: list[Step], now: datetime | None = None) -> list[StepView]:
    now = now or timezone.now()
    rows = []
    results: list[Any] = []  # the earlier tool steps' results, newest first (the call's facts)
    for step in steps:
        hidden = run.redacted_fields(step.tool)
        policy = run.tool_policy(step.tool) if step.kind == StepKind.TOOL else {}
        retry_in = None
        if step.next_attempt_at and step.status == "pending":
            retry_in = max(0.0, (step.next_attempt_at - now).total_seconds())
        rows.append(
            StepView(
                step=step,
                arguments=pretty_json(redact_fields(step.arguments, hidden)),
                result=pretty_json(redact_fields(step.result, hidden)),
                error=redact_text(step.error),
                attempts=[
                    AttemptView(a, redact_text(a.error), redact_text(a.traceback))
                    for a in step.attempt_rows.all()
                ],
                approval=_approval(step),
                policy=policy,
                retry=_retry_view(policy, step),
                tool_calls=redact_tool_calls(step.tool_calls, run.redacted_fields)
                if step.kind == StepKind.MODEL
                else [],
                retry_in_seconds=retry_in,
                cannot_run=_cannot_run(run, step),
                words=_words(run, step, hidden, results),
            )
        )
        if step.kind == StepKind.TOOL and isinstance(step.result, dict):
            results.insert(0, redact_fields(step.result, hidden))
    return rows


def _words(run: Run, step: Step, hidden: Any, results: list[Any]) -> str:
    if step.kind != StepKind.TOOL or not step.tool:
        return ""
    approval = _approval(step)
    args = approval.effective_args if approval is not None else step.arguments
    shown = redact_fields(args, hidden) if isinstance(args, dict) else {}
    return call_in_words(step.tool, shown, facts(shown, results, run.input))


def _cannot_run(run: Run, step: Step) -> str:
    if step.status != StepStatus.WAITING_APPROVAL:
        return ""
    approval = _approval(step)
    args = approval.effective_args if approval is not None else step.arguments
    return cannot_run(run.agent, step.tool, args)


def _approval(step: Step) -> Any:
    try:
        return step.approval  # select_related by the view; absent for most steps
    except Exception:  # RelatedObjectDoesNotExist
        return None


def _fmt_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def timeline_svg(run: Run, steps: list[Step], width: int = 760, row: int = 16) -> SafeString:
    """One row per step, one bar per attempt coloured by its outcome, on a shared time axis.

    Gaps between a step's attempts (retry backoff, a crashed worker's lease running out, a run
    parked for approval) show as a thin line, so where the time went is visible at a glance.
    """
    if not steps:
        return mark_safe("")
    now = timezone.now()
    attempts = [a for step in steps for a in step.attempt_rows.all()]
    start = min([run.created_at, *(a.started_at for a in attempts)])
    end_candidates = [a.finished_at or now for a in attempts]
    end_candidates.append(run.finished_at or (now if not run.is_terminal else start))
    end = max(end_candidates)
    total = max((end - start).total_seconds(), 0.001)
    label_w, right_pad, axis_h = 170, 12, 18
    scale = (width - label_w - right_pad) / total
    height = row * len(steps) + axis_h + 4

    def x_of(moment: datetime) -> float:
        return label_w + (moment - start).total_seconds() * scale

    parts = [
        f'<svg class="timeline" role="img" aria-label="step timeline, {len(steps)} steps over '
        f'{escape(_fmt_seconds(total))}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, step in enumerate(steps):
        y = i * row + 2
        label = f"#{step.index} {step.tool or 'model'}"
        parts.append(
            f'<text x="0" y="{y + row - 5}" font-size="11" fill="#2d3748">{escape(label[:26])}</text>'
        )
        step_attempts = list(step.attempt_rows.all())
        if len(step_attempts) > 1:  # the span from the first try to the last: backoff gaps
            first, last = step_attempts[0], step_attempts[-1]
            x1, x2 = x_of(first.started_at), x_of(last.finished_at or now)
            mid = y + (row - 4) / 2
            parts.append(
                f'<line x1="{x1:.1f}" y1="{mid:.1f}" x2="{x2:.1f}" y2="{mid:.1f}" '
                f'stroke="#a0aec0" stroke-dasharray="2 2"/>'
            )
        for attempt in step_attempts:
            finished = attempt.finished_at or now
            x = x_of(attempt.started_at)
            w = max(2.0, (finished - attempt.started_at).total_seconds() * scale)
            colour = COLOURS.get(attempt.outcome, "#718096")
            took = _fmt_seconds((finished - attempt.started_at).total_seconds())
            tip = f"{label} attempt {attempt.number}: {attempt.outcome}, {took}"
            if attempt.worker:
                tip += f" on {attempt.worker}"
            if attempt.error:
                tip += f" ({redact_text(attempt.error)[:160]})"
            parts.append(
                f'<rect class="attempt o-{escape(attempt.outcome)}" data-step="{step.index}" '
                f'data-attempt="{attempt.number}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                f'height="{row - 4}" rx="2" fill="{colour}"><title>{escape(tip)}</title></rect>'
            )
        if not step_attempts:
            colour = MARKERS.get(step.status, "#a0aec0")
            x = x_of(step.created_at)
            tip = f"{label}: {step.status}"
            if step.next_attempt_at and step.status == "pending":
                tip += f", next try at {timezone.localtime(step.next_attempt_at):%H:%M:%S}"
            parts.append(
                f'<rect class="marker s-{escape(step.status)}" data-step="{step.index}" x="{x:.1f}" '
                f'y="{y + 2}" width="6" height="{row - 8}" fill="{colour}" fill-opacity="0.8">'
                f"<title>{escape(tip)}</title></rect>"
            )
    axis_y = height - 4
    parts.append(
        f'<line x1="{label_w}" y1="{axis_y - 10}" x2="{width - right_pad}" y2="{axis_y - 10}" '
        f'stroke="#e2e8f0"/>'
        f'<text x="{label_w}" y="{axis_y}" font-size="10" fill="#718096">0</text>'
        f'<text x="{width - right_pad}" y="{axis_y}" font-size="10" fill="#718096" '
        f'text-anchor="end">{escape(_fmt_seconds(total))}</text></svg>'
    )
    return mark_safe("".join(parts))


def legend(steps: list[Step]) -> list[tuple[str, str]]:
    """(outcome, colour) for the outcomes the SVG actually draws."""
    seen = {a.outcome for step in steps for a in step.attempt_rows.all()}
    return [(name, colour) for name, colour in COLOURS.items() if name in seen]
