"""The run page as support staff read it: the conversation first (the customer's message, the
agent's words, the reply it sent, the hand-overs to a person), the input as fields, and who may
act on the run.

The runtime knows nothing of customers: the customer's message is the input's `message` (the
input of every Pydantic AI agent, DESIGN.md 6), and a reply is the argument the run's agent
names in its `replies` (the demo's `send_customer_reply(message=...)`), redacted like every
argument people see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentruns.models import Run, RunStatus, Step, StepKind, StepStatus
from agentruns.registry import UnknownAgent, get_agent
from agentruns.runtime.values.redaction import redact_fields
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


def input_items(run: Run) -> list[InputItem]:
    """The input's fields, the customer's message left out (the conversation shows it)."""
    if not isinstance(run.input, dict):
        return [InputItem("input", json.dumps(run.input, ensure_ascii=False), True)]
    items = []
    for name, value in run.input.items():
        if name == MESSAGE_KEY and isinstance(value, str):
            continue
        if isinstance(value, str):
            items.append(InputItem(str(name), value, "\n" in value or len(value) > 80))
        else:
            text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
            items.append(InputItem(str(name), text, isinstance(value, dict | list)))
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
    if run.status == RunStatus.FAILED:
        action = "retry this run or mark its failed step resolved"
    elif run.status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING):
        action = "cancel this run"
    else:
        return ""
    groups = groups_with_permission(OPERATE)
    whom = f"someone in {', '.join(groups)}, or an administrator" if groups else "an administrator"
    return f"Only operators can {action}: ask {whom}."
