"""The approvals app as the runtime's inbox (agentruns/runtime/inbox.py), registered at start-up
by `ApprovalsConfig.ready`. Each method is the app's own function for the job, called inside
the runtime's transaction; the inbox's figures for /metrics are computed here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    Q,
    Sum,
    Value,
)
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric

from agentruns.models import Run, Step
from agentruns.runtime.inbox import Refused
from agentruns.runtime.values.ids import is_uuid
from approvals.domain import escalation, outcomes, parking
from approvals.models import Approval, ApprovalKind, DeliveryStatus, WebhookDelivery
from approvals.notifications import outbox

APPROVAL_AGE_BUCKETS = (60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
KINDS = ("approval", "reconciliation", "handover", "question")


class ApprovalInbox:
    """The runtime's `Inbox`, provided by this app."""

    table = Approval._meta.db_table

    def open_approval(self, step: Step, agent: str) -> int:
        return parking.open_approval(step, agent).id

    def open_reconciliation(self, step: Step, agent: str) -> int:
        return parking.open_reconciliation(step, agent).id

    def open_handover(self, step: Step, agent: str) -> int | None:
        opened = parking.open_handover(step, agent)
        return opened.id if opened is not None else None

    def open_question(
        self, step: Step, agent: str, *, token: str, question: str, choices: list[str] | None
    ) -> int:
        return parking.open_question(
            step, agent, token=token, question=question, choices=choices
        ).id

    def question_calls(self, run: Run, call_ids: list[str]) -> set[str]:
        steps = [i for i in call_ids if is_uuid(i)]  # the stream names a call by its step
        rows = Approval.objects.filter(run=run, kind=ApprovalKind.QUESTION, step_id__in=steps)
        return {str(step) for step in rows.values_list("step_id", flat=True)}

    def answer_question(self, run: Run, call_id: str, *, user: Any, answer: str) -> int:
        from approvals import services  # the decision service sits above this port
        from approvals.errors import AlreadyDecided, DecisionError, status_of

        item = (
            Approval.objects.filter(
                run=run, kind=ApprovalKind.QUESTION, step_id=call_id if is_uuid(call_id) else None
            )
            .values_list("id", flat=True)
            .first()
        )
        if item is None:
            raise Refused(f"tool call {call_id} asked no question of this chat's run", 404)
        try:
            services.decide(item, "answer", user, answer=answer, door=services.Door.CHAT)
        except AlreadyDecided:
            pass  # somebody answered first: the continuation shows their answer
        except DecisionError as exc:  # empty, not a choice, no right to answer
            raise Refused(str(exc), status_of(exc), exc.code) from None
        return item

    def approved_call_refusal(self, step: Step) -> str:
        return parking.approved_call_refusal(step)

    def approval_of(self, step: Step) -> dict[str, Any] | None:
        return parking.approval_of(step)

    def withdraw(self, run: Run, *, reason: str) -> list[int]:
        return parking.withdraw_approvals(run, reason=reason)

    def expire_due(self, now: datetime) -> int:
        return outcomes.expire_due_approvals(now)

    def escalate_due(self, now: datetime) -> int:
        return escalation.escalate_due_approvals(now)

    def run_failed(self, run_id: Any, fields: dict[str, Any]) -> None:
        outbox.run_failed(run_id, fields)

    def agent_said(
        self, run_id: Any, thread_id: str, *, asked: bool, message_id: str, text: str, sent_at: Any
    ) -> None:
        outbox.agent_said(
            run_id, thread_id, asked=asked, message_id=message_id, text=text, sent_at=sent_at
        )

    def forget_runs(self, run_ids: list, *, dry_run: bool) -> dict[str, int]:
        return outbox.forget_runs(run_ids, dry_run=dry_run)

    def delivery_loop(self) -> threading.Thread:
        from approvals.notifications.loop import DeliveryLoop

        return DeliveryLoop()

    def answer(
        self, run: Run, approval_id: int, *, approved: bool, user: Any, reason: str, version: int
    ) -> str:
        from approvals import services  # the decision service sits above this port
        from approvals.errors import AlreadyDecided, DecisionError, StaleProposal, status_of

        kind = Approval.objects.filter(id=approval_id, run=run).values_list("kind", flat=True)
        if not kind:
            raise Refused(f"approval {approval_id} is not part of this chat's run", 404)
        if kind[0] != ApprovalKind.APPROVAL:
            raise Refused(f"approval {approval_id} is a {kind[0]}: decide it in the inbox", 409)
        try:
            services.decide(
                approval_id,
                "approve" if approved else "reject",
                user,
                reason=reason,
                version=version,
                door=services.Door.CHAT,
            )
        except AlreadyDecided:
            return "decided earlier"
        except StaleProposal:
            return "stale"
        except DecisionError as exc:  # the policy's status: 400/403/409/422
            raise Refused(str(exc), status_of(exc), exc.code) from None
        return "decided"

    def metric_families(self, now: datetime) -> Iterator[Metric]:
        return approval_families(now)

    def delivery_families(self, now: datetime) -> Iterator[Metric]:
        return outbox_families(now)


def approval_families(now: Any) -> Iterator[Metric]:
    """Pending inbox items by agent and kind, in one query bucketed by the database."""
    buckets = {
        f"le_{i}": Count("id", filter=Q(created_at__gte=now - timedelta(seconds=bound)))
        for i, bound in enumerate(APPROVAL_AGE_BUCKETS)
    }
    waited = ExpressionWrapper(
        Value(now, output_field=DateTimeField()) - F("created_at"), output_field=DurationField()
    )
    rows = list(
        Approval.objects.filter(status="pending")
        .order_by()
        .values("agent", "kind")
        .annotate(
            n=Count("id"),
            overdue=Count("id", filter=Q(due_at__lt=now)),
            oldest=Min("created_at"),
            waited=Sum(waited),
            **buckets,
        )
    )
    oldest = min((row["oldest"] for row in rows), default=None)
    yield GaugeMetricFamily(
        "agentruns_oldest_pending_approval_age_seconds",
        "Age of the oldest pending approval or reconciliation (0 when none)",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )
    by_kind = GaugeMetricFamily(
        "agentruns_pending_approvals", "Pending inbox items by kind", labels=["kind"]
    )
    for kind in KINDS:
        by_kind.add_metric([kind], sum(row["n"] for row in rows if row["kind"] == kind))
    yield by_kind

    per_agent: dict[str, dict[str, Any]] = {}
    for row in rows:
        agent = per_agent.setdefault(
            row["agent"], {"n": 0, "overdue": 0, "waited": 0.0, "le": [0] * len(buckets)}
        )
        agent["n"] += row["n"]
        agent["overdue"] += row["overdue"]
        agent["waited"] += row["waited"].total_seconds() if row["waited"] else 0.0
        for i in range(len(buckets)):
            agent["le"][i] += row[f"le_{i}"]
    ages = GaugeHistogramMetricFamily(
        "agentruns_approval_age_seconds",
        "Ages of the pending approvals and reconciliations, by agent",
        labels=["agent"],
    )
    pending = GaugeMetricFamily(
        "agentruns_pending_approvals_by_agent", "Pending inbox items by agent", labels=["agent"]
    )
    overdue = GaugeMetricFamily(
        "agentruns_approvals_overdue",
        "Pending inbox items past their due time (AGENTRUNS_APPROVAL_ESCALATE_SECONDS)",
        labels=["agent"],
    )
    for name, agent in sorted(per_agent.items()):
        cumulative = [(str(float(b)), agent["le"][i]) for i, b in enumerate(APPROVAL_AGE_BUCKETS)]
        ages.add_metric([name], [*cumulative, ("+Inf", agent["n"])], gsum_value=agent["waited"])
        pending.add_metric([name], agent["n"])
        overdue.add_metric([name], agent["overdue"])
    yield from (ages, pending, overdue)


# ------------------------------------------------------------------ the outbox
def outbox_families(now: Any) -> Iterator[Metric]:
    backlog = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    yield GaugeMetricFamily(
        "agentruns_webhook_outbox_backlog",
        "Webhook deliveries not delivered yet (pending, retries included)",
        value=backlog["n"],
    )
    oldest = backlog["oldest"]
    yield GaugeMetricFamily(
        "agentruns_webhook_outbox_oldest_undelivered_age_seconds",
        "Age of the oldest undelivered webhook delivery (0 when none)",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )
