"""The outbox writers: one delivery row per event and endpoint, one mail notice per item (and
what the retention purge removes of them).

Always called inside the transaction of the change being reported: a change that rolls back
leaves no event behind, and a committed change always has its event (the delivery loop sends it
at least once, however often workers die). The body is serialised here, once: every try sends
the same bytes under the same `webhook-id`.

Part of the runtime layer (the executor, parking and the sweeper call it): no HTTP, no templates.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db.models import Q
from django.utils import timezone

from agentruns.models import Run
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.redaction import redact_fields, redact_text
from agentruns.runtime.values.timestamps import iso
from approvals.conf import conf
from approvals.models import (
    Approval,
    DeliveryStatus,
    MailNotice,
    WebhookDelivery,
    WebhookEndpoint,
)

APPROVAL_REQUESTED = "approval.requested"
APPROVAL_ESCALATED = "approval.escalated"
APPROVAL_DECIDED = "approval.decided"
APPROVAL_WITHDRAWN = "approval.withdrawn"
RUN_FAILED = "run.failed"
# a run handed its request over to a person (an inbox item of kind handover), and it was closed
HANDOVER_OPENED = "handover.opened"
HANDOVER_CLOSED = "handover.closed"
# the agent asked a person a question (an inbox item of kind question), and it was answered
QUESTION_ASKED = "question.asked"
QUESTION_ANSWERED = "question.answered"
# the agent answered a message of a thread, or asked the thread's customer (`ask_customer`): a
# system that relays the conversation (mail, a helpdesk) tells the customer
THREAD_ANSWERED = "thread.answered"
THREAD_ASKED = "thread.asked"
EVENT_TYPES = (
    APPROVAL_REQUESTED,
    APPROVAL_ESCALATED,
    APPROVAL_DECIDED,
    APPROVAL_WITHDRAWN,
    RUN_FAILED,
    HANDOVER_OPENED,
    HANDOVER_CLOSED,
    QUESTION_ASKED,
    QUESTION_ANSWERED,
    THREAD_ANSWERED,
    THREAD_ASKED,
)


def new_webhook_id() -> str:
    """`msg_<32 hex>`: unique per event, no `.` (it is part of the signed content)."""
    return f"msg_{uuid.uuid4().hex}"


def settings_endpoint_events() -> list[str]:
    """The event types AGENTRUNS_WEBHOOK_URL receives ([] when no URL is configured)."""
    if not conf.WEBHOOK_URL:
        return []
    wanted = [e.strip() for e in conf.WEBHOOK_EVENTS.split(",") if e.strip()]
    return wanted or list(EVENT_TYPES)


# ------------------------------------------------------------------ payloads
def _base_url() -> str:
    return conf.APP_BASE_URL.rstrip("/")


def inbox_url() -> str:
    # the inbox and its item pages (approvals/web/urls.py), written out here because the runtime
    # layer does not resolve URLs
    return f"{_base_url()}/approvals/"


def approval_url(approval_id: int) -> str:
    return f"{inbox_url()}{approval_id}/"


def run_url(run_id: Any) -> str:
    return f"{_base_url()}/runs/{run_id}/"


def approval_data(approval: Approval) -> dict:
    """What a receiver needs about an item, redacted like the inbox card."""
    hidden = approval.hidden_fields
    args = redact_fields(approval.effective_args, hidden)
    claimant = approval.claimant()
    return {
        "id": approval.id,
        "kind": approval.kind,
        "status": approval.status,
        "agent": approval.agent,
        "tool": approval.tool,
        "args": args,
        "requested_args": approval.visible_args(),
        "amount_cents": approval.amount_cents,
        "created_at": iso(approval.created_at),
        "due_at": iso(approval.due_at),
        "escalated_at": iso(approval.escalated_at),
        "claimed_by": actor_name(claimant),
        "decided_by": approval.decided_by_name,
        "decided_at": iso(approval.decided_at),
        "reason": approval.reason,
        "resolution": approval.resolution or None,
        # a question: what was asked, the choices if any, the answer once given
        **(
            {"question": approval.question, "choices": approval.choices, "answer": approval.answer}
            if approval.kind == "question"
            else {}
        ),
        "url": approval_url(approval.id),
    }


def run_data(run: Run) -> dict:
    return {
        "id": str(run.id),
        "agent": run.agent,
        "status": run.status,
        "error": redact_text(run.error),
        "stop_reason": run.stop_reason,
        "outcome": run.outcome or None,
        "created_at": iso(run.created_at),
        "finished_at": iso(run.finished_at),
        "url": run_url(run.id),
    }


def _body(event_type: str, approval: Approval | None, run: Run | None, thread: dict | None) -> str:
    data = {
        "approval": approval_data(approval) if approval is not None else None,
        "run": run_data(run) if run is not None else None,
    }
    if thread is not None:
        data["thread"] = thread
    payload = {"type": event_type, "timestamp": iso(timezone.now()), "data": data}
    # compact and exactly these bytes on every try: the signature covers them
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)


# ------------------------------------------------------------------ writers
def record(
    event_type: str,
    *,
    approval: Approval | None = None,
    run: Run | None = None,
    thread: dict | None = None,
) -> str:
    """One delivery per endpoint that wants `event_type`, in the caller's transaction.

    Returns the event's webhook id ("" when no endpoint wants it: nothing is written)."""
    targets: list[WebhookEndpoint | None] = []
    if event_type in settings_endpoint_events():
        targets.append(None)
    targets += [e for e in WebhookEndpoint.objects.filter(active=True) if e.wants(event_type)]
    if not targets:
        return ""
    if run is None and approval is not None:
        run = approval.run
    webhook_id, body = new_webhook_id(), _body(event_type, approval, run, thread)
    WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(
                webhook_id=webhook_id,
                event_type=event_type,
                body=body,
                endpoint=endpoint,
                run_id=run.id if run is not None else None,
                approval_id=approval.id if approval is not None else None,
            )
            for endpoint in targets
        ]
    )
    return webhook_id


def _nobody_listens() -> bool:
    """No endpoint at all: the run need not be read to write nothing."""
    return (
        not settings_endpoint_events() and not WebhookEndpoint.objects.filter(active=True).exists()
    )


def run_failed(run_id: Any, fields: dict[str, Any]) -> str:
    """A run is about to end `failed` with `fields` (a `transitions.RunChange`'s), inside the
    transaction that writes it."""
    if _nobody_listens():
        return ""
    run = Run.objects.get(id=run_id)
    for name in ("status", "error", "stop_reason", "outcome", "finished_at"):
        if name in fields:
            setattr(run, name, fields[name])
    return record(RUN_FAILED, run=run)


def agent_said(
    run_id: Any, thread_id: str, *, asked: bool, message_id: str, text: str, sent_at: Any
) -> str:
    """The agent answered a message of `thread_id` (`thread.answered`), or asked its customer a
    question and waits for the reply (`thread.asked`: `text` is the question, "" when the tool
    code asked none), inside the transaction that stores it."""
    if _nobody_listens():
        return ""
    message = {
        "id": message_id,
        "author": "agent",
        "text": redact_text(text),
        "created_at": iso(sent_at),
    }
    return record(
        THREAD_ASKED if asked else THREAD_ANSWERED,
        run=Run.objects.get(id=run_id),
        thread={"id": thread_id, "message": message},
    )


def forget_runs(run_ids: list, *, dry_run: bool) -> dict[str, int]:
    """The webhook deliveries of finished runs the retention purge removes (no foreign key ties
    them to a run or an item): those delivered or given up; a pending one is still sent.
    Deleted, or only counted (`dry_run`); {table: rows}."""
    items = Approval.objects.filter(run_id__in=run_ids).values("id")
    rows = WebhookDelivery.objects.filter(Q(run_id__in=run_ids) | Q(approval_id__in=items)).exclude(
        status=DeliveryStatus.PENDING
    )
    count = rows.count() if dry_run else rows.delete()[0]
    return {WebhookDelivery._meta.db_table: count} if count else {}


def queue_mail(approval: Approval, kind: str) -> None:
    """Somebody should hear about this item by email; the mailer batches what accumulates."""
    if conf.APPROVAL_EMAILS:
        MailNotice.objects.create(approval=approval, kind=kind)
