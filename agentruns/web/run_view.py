"""The run page as support staff read it: the conversation first (the customer's message, the
agent's words, the reply it sent, the hand-overs to a person), the input as fields, and who may
act on the run.

The runtime knows nothing of customers: the customer's message is the input's `message` (the
input of every Pydantic AI agent, DESIGN.md 6), and a reply is the argument the run's agent
names in its `replies` (the demo's `send_customer_reply(message=...)`), redacted like every
argument people see.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentruns.models import Run, RunEvent, RunStatus, Step, StepKind, StepStatus
from agentruns.registry import UnknownAgent, get_agent
from agentruns.registry.outcomes import label as outcome_label
from agentruns.runtime.events import EventType
from agentruns.runtime.values.redaction import redact_fields
from agentruns.runtime.values.timestamps import ago_text, moment_text, parse_moment
from agentruns.selectors.calls import (
    CURRENCY_KEYS,
    argument_label,
    facts,
    first_text,
    value_in_words,
)
from agentruns.selectors.people import groups_with_permission

MESSAGE_KEY = "message"
# the inbox item's kind for a hand-over (the inbox app's; the runtime reads its items by the
# step's `approval` relation, as the step table does)
HANDOVER_KIND = "handover"
OPERATE = "agentruns.operate_run"
# a reply's state in words, by its step's status
REPLY_STATES = {
    StepStatus.SUCCEEDED: "sent",
    StepStatus.PENDING: "about to be sent",
    StepStatus.RUNNING: "sending",
    StepStatus.WAITING_APPROVAL: "waiting for approval",
    StepStatus.FAILED: "not sent: the call failed",
    StepStatus.REJECTED: "not sent: rejected",
    StepStatus.UNKNOWN: "maybe sent: the outcome is being checked",
    StepStatus.SKIPPED: "not sent",
}


@dataclass
class InputItem:
    name: str
    value: str
    long: bool  # several lines or a structure: shown as a block

    @property
    def label(self) -> str:
        return argument_label(self.name)


@dataclass
class Reply:
    step: int
    text: str
    state: str
    sent: bool
    at: datetime | None


@dataclass
class HandOver:
    """A hand-over of the run's request to a person (a `handover=True` tool's call): why, and
    where its inbox item stands."""

    step: int
    why: str  # the call's `reason` argument, as the agent gave it
    approval: Any  # the inbox item: its status, who holds or closed it, their reason and note

    @property
    def state(self) -> str:
        a = self.approval
        if a.status == "pending":
            held = getattr(a.claimed_by, "get_username", None)
            return f"taken by {held()}" if held else "waiting in the inbox"
        if a.resolution == "withdrawn":
            return "withdrawn"
        who = a.decided_by.get_username() if a.decided_by is not None else "the system"
        return f"closed by {who}"


def _item(step: Step) -> Any:
    try:
        return step.approval  # select_related by the view; absent for most steps
    except Exception:  # RelatedObjectDoesNotExist
        return None


def handovers(run: Run, steps: list[Step]) -> list[HandOver]:
    """The run's hand-overs to a person, in step order, with their inbox items."""
    out = []
    for step in steps:
        item = _item(step) if step.kind == StepKind.TOOL else None
        if item is None or item.kind != HANDOVER_KIND:
            continue
        args = step.arguments if isinstance(step.arguments, dict) else {}
        why = redact_fields(args, run.redacted_fields(step.tool)).get("reason")
        out.append(HandOver(step.index, why if isinstance(why, str) else "", item))
    return out


def customer_message(run: Run) -> str:
    message = run.input.get(MESSAGE_KEY) if isinstance(run.input, dict) else None
    return message if isinstance(message, str) else ""


def input_items(run: Run, steps: list[Step]) -> list[InputItem]:
    """The input's fields, the customer's message left out (the conversation shows it); a field
    that is no text in words (a record in a line, an amount in the currency the run's tool
    results name: `value_in_words`). The input as JSON is the engineering detail's."""
    if not isinstance(run.input, dict):
        return [InputItem("input", value_in_words("input", run.input), True)]
    results = [s.result for s in reversed(steps) if s.kind == StepKind.TOOL]
    currency = first_text(facts({}, results, run.input), CURRENCY_KEYS) or ""
    items = []
    for name, value in run.input.items():
        if name == MESSAGE_KEY and isinstance(value, str):
            continue
        text = value if isinstance(value, str) else value_in_words(str(name), value, currency)
        items.append(InputItem(str(name), text, "\n" in text or len(text) > 80))
    return items


def _reply_args(run: Run) -> dict[str, str]:
    """tool -> the argument it sends the customer, as the run's agent declares (`replies`)."""
    try:
        return dict(get_agent(run.agent).replies)
    except UnknownAgent:  # a deploy removed the agent: its runs show no replies
        return {}


def replies(run: Run, steps: list[Step]) -> list[Reply]:
    """What the run's tool calls said (or would say) to the customer, in step order."""
    declared = _reply_args(run)
    out = []
    for step in steps:
        arg = declared.get(step.tool) if step.kind == StepKind.TOOL else None
        if not arg or not isinstance(step.arguments, dict):
            continue
        shown = redact_fields(step.arguments, run.redacted_fields(step.tool))
        text = shown.get(arg)
        if not isinstance(text, str) or not text:
            continue
        state = REPLY_STATES.get(step.status, step.status)
        sent = step.status == StepStatus.SUCCEEDED
        out.append(Reply(step.index, text, state, sent, step.finished_at if sent else None))
    return out


def who_may_act(run: Run, user: Any) -> str:
    """For someone who may not operate runs: who can, for what this run needs ("" when the run
    needs nothing, or the user may act)."""
    if user.has_perm(OPERATE):
        return ""
    groups = groups_with_permission(OPERATE)
    whom = f"someone in {', '.join(groups)}, or an administrator" if groups else "an administrator"
    if run.status == RunStatus.FAILED:
        return f"Only operators can retry this run or mark its failed step resolved: ask {whom}."
    if run.status in ACTIVE:
        if run.created_by_id == getattr(user, "pk", None):
            return ""  # its starter may stop it: the Stop button says what it does
        starter = run.created_by.get_username() if run.created_by_id else ""
        by = f"{starter} (who started it)" if starter else "the person who started it"
        return f"Only {by} or an operator can stop this run: ask {whom}."
    return ""


# ------------------------------------------------------------------ where the run stands, in words
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)
STOPPED, CANCELLED = "stopped", "cancelled"  # a run's stop reason after a stop, a cancel


@dataclass
class Banner:
    """One sentence at the top of the run page on where the run stands, kept current by the
    page's stream (runstream.js swaps it when the status changes). `tone`: working, waiting,
    done, failed, stopped."""

    text: str
    tone: str
    since: datetime | None = None

    @property
    def since_text(self) -> str:
        return ago_text(self.since) if self.since else ""


def subject(run: Run) -> str:
    """What the run is about, as its input names it: the most specific of its agent's search
    fields that the input has (the demo: the ticket, else the order)."""
    if not isinstance(run.input, dict):
        return ""
    try:
        fields = list(get_agent(run.agent).search_fields)
    except UnknownAgent:
        fields = []
    for name in reversed(fields):
        value = run.input.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _held(steps: list[Any]) -> Any:
    """The step row (timeline.StepView) the run waits on a person for, if any."""
    for row in steps:
        if row.step.status in (StepStatus.WAITING_APPROVAL, StepStatus.UNKNOWN):
            return row
    return None


def _waiting_text(run: Run, rows: list[Any], waiting_for: dict | None) -> str:
    kind = (waiting_for or {}).get("kind")
    held = _held(rows)
    item = held.approval if held is not None else None
    if kind == "question" or (item is not None and item.kind == "question"):
        asked = getattr(item, "question", "") if item is not None else ""
        return f"Waiting for an answer: {asked}" if asked else "Waiting for an answer"
    if held is not None and held.step.status == StepStatus.UNKNOWN:
        return f"Waiting for a person to check whether this happened: {held.words}"
    if held is not None:
        return f"Waiting for an approver: {held.words}"
    if kind == "message":
        return "Waiting for the customer's reply"
    if kind == "timer":
        due = (waiting_for or {}).get("due")
        return f"Sleeping until {moment_text(due)}" if due else "Sleeping"
    if kind == "event":
        return "Waiting for a message from another system"
    return "Waiting"


def banner(
    run: Run, rows: list[Any], waiting_for: dict | None, waiting_line: str = "", ended: str = ""
) -> Banner:
    """Where the run stands, in words: "The refund agent is working on T-1050", "Waiting for an
    approver: refund 327.32 USD to Jun Sato", "Finished: partially refunded". `ended`: the run's
    `end_line`, read once by the page that shows both."""
    about = subject(run)
    on = f" on {about}" if about else ""
    if run.status == RunStatus.QUEUED:
        if waiting_line:
            return Banner(f"Waiting to start: {waiting_line}", "waiting")
        if run.error:  # the reason a queued run waits (a quota, the model's rate limit)
            why = run.error
            if why.lower().startswith("waiting"):  # "waiting on the model's rate limit (...)"
                return Banner(why[:1].upper() + why[1:], "waiting")
            return Banner(f"Waiting to start: {why}", "waiting")
        return Banner(f"The {run.agent} agent is starting{on}…", "working")
    if run.status == RunStatus.RUNNING:
        return Banner(f"The {run.agent} agent is working{on}…", "working")
    if run.status == RunStatus.WAITING:
        since = parse_moment((waiting_for or {}).get("since"))
        return Banner(_waiting_text(run, rows, waiting_for), "waiting", since)
    if run.status == RunStatus.SUCCEEDED:
        done = outcome_label(run.outcome) if run.outcome else ""
        return Banner(f"Finished: {done}" if done else "Finished", "done", run.finished_at)
    if run.status == RunStatus.CANCELLED:
        return Banner(ended or end_line(run), "stopped", run.finished_at)
    return Banner("The run failed", "failed", run.finished_at)  # why: #stop-reason below


def _stop_request(run: Run) -> dict:
    """Who asked the run to stop (or cancel) and why: the latest request's event data."""
    data = (
        RunEvent.objects.filter(run_id=run.id, type=EventType.RUN_CANCEL_REQUESTED)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return data if isinstance(data, dict) else {}


def end_line(run: Run) -> str:
    """Why the run ended early, in one sentence: "Stopped by approver", "Cancelled by lead: the
    customer called", "Stopped: the run's deadline passed"; "" for a run that did not."""
    if run.stop_reason in (STOPPED, CANCELLED):
        request = _stop_request(run)
        who = request.get("by")
        line = f"{run.stop_reason.capitalize()}{f' by {who}' if who else ''}"
        reason = str(request.get("reason") or "").strip()
        return f"{line}: {reason}" if reason else line
    if run.stop_reason:
        return f"Stopped: {run.error}" if run.error else f"Stopped ({run.stop_reason})"
    return ""


def withdrawn_by_stop(rows: list[Any]) -> list[str]:
    """What stopping the run now would take out of the inbox, in words (its pending calls)."""
    return [
        row.words
        for row in rows
        if row.approval is not None
        and row.approval.status == "pending"
        and row.approval.kind in ("approval", "reconciliation")
    ]
