"""The inbox's decided items: what was decided, by whom, newest decision first, searchable.

Keyset-paginated on (decided_at, id) with the app's one pagination helper; the partial index
`approval_decided_idx` walks it. Every search narrows that walk: the order or customer through
the runs' own search keys (the runtime's run search, so the same words find the same runs in
the runs list), the decider by name among the final decider and every approver's decision row,
the date range on the decision time, the kind, and the outcome.

What became of an approved call (`not_made`): an approval says a person agreed, not that the call
happened. A call can be approved and still not be made: its operation key was done meanwhile (it
is answered "already done" with the earlier execution), the tool's limit refused it right before
it ran (another request filled the order), or the deployed code refused it. Everywhere an
approved item is listed (the card and the item page, the decided view, the API's `not_made`)
says so, so nobody reads "approved 327.32 USD" where nothing was paid. Read from the item's
step, which every listing loads with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from agentruns.models import Run, StepStatus
from agentruns.registry import get_tool, has_tool
from agentruns.runtime.values.timestamps import moment_text
from agentruns.selectors.calls import tool_label
from agentruns.selectors.pagination import KeysetPage, keyset_page
from agentruns.selectors.run_list import search_condition
from approvals.domain.decisions import args_diff
from approvals.domain.selectors import approvals_query
from approvals.models import (
    Approval,
    ApprovalDecision,
    ApprovalKind,
    ApprovalStatus,
    DecisionKind,
)

# outcome -> (label, condition)
OUTCOMES: dict[str, tuple[str, Q]] = {
    "approved": ("approved", Q(status=ApprovalStatus.APPROVED)),
    "edited": ("approved with edits", Q(status=ApprovalStatus.APPROVED, edited_args__isnull=False)),
    "rejected": ("rejected", Q(status=ApprovalStatus.REJECTED)),
    "expired": ("expired", Q(status=ApprovalStatus.EXPIRED)),
    "happened": ("reconciled: it happened", Q(resolution="happened")),
    "retry": ("reconciled: retried", Q(resolution="retry")),
    "abort": ("reconciled: run aborted", Q(resolution="abort")),
    "withdrawn": ("withdrawn", Q(resolution="withdrawn")),
    "closed": (
        "hand-over closed",
        Q(kind=ApprovalKind.HANDOVER, status=ApprovalStatus.RESOLVED),
    ),
}
TEXT_MAX = 100
RUN_IDS_MAX = 500


def _day(raw: str) -> date | None:
    try:
        return date.fromisoformat(raw.strip()) if raw and len(raw) <= 10 else None
    except ValueError:
        return None


@dataclass(frozen=True)
class HistoryFilters:
    q: str = ""  # an order, ticket or run id, or the customer's name
    decider: str = ""  # a username: the final decider or any approver
    since: date | None = None  # decided on or after this day (the server's time zone)
    until: date | None = None  # decided on or before this day
    kind: str = ""
    outcome: str = ""

    @classmethod
    def from_query(cls, params) -> HistoryFilters:
        kind, outcome = params.get("kind", ""), params.get("outcome", "")
        return cls(
            q=params.get("q", "").strip()[:TEXT_MAX],
            decider=params.get("decider", "").strip()[:150],
            since=_day(params.get("since", "")),
            until=_day(params.get("until", "")),
            kind=kind if kind in ApprovalKind.values else "",
            outcome=outcome if outcome in OUTCOMES else "",
        )

    def as_params(self) -> dict[str, str]:
        params = {
            "q": self.q,
            "decider": self.decider,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
            "kind": self.kind,
            "outcome": self.outcome,
        }
        return {k: v for k, v in params.items() if v}

    @property
    def active(self) -> bool:
        return bool(self.as_params())


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _runs_matching(q: str) -> Q:
    """The items of the runs the runtime's run search finds (order, ticket, customer, run id).

    A few hundred runs (an order, a customer) are read first and named by id, so the database
    reads their items by the run index; as a subquery it would walk every decided item newest
    first, testing each (90 ms at 10,000 for an order with four). A search matching more runs
    than that fills a page within its first steps down the decision index: a subquery then."""
    runs = Run.objects.filter(search_condition(q)).values_list("id", flat=True)
    found = list(runs[: RUN_IDS_MAX + 1])
    if len(found) <= RUN_IDS_MAX:
        return Q(run_id__in=found)
    return Q(run__in=runs)


def decided_query(filters: HistoryFilters) -> QuerySet[Approval]:
    rows = approvals_query(status="").filter(decided_at__isnull=False)
    if filters.q:
        rows = rows.filter(_runs_matching(filters.q))
    if filters.decider:
        approved_by = ApprovalDecision.objects.filter(
            approval=OuterRef("pk"), username__iexact=filters.decider
        )
        rows = rows.filter(Q(decided_by__username__iexact=filters.decider) | Exists(approved_by))
    if filters.since:
        rows = rows.filter(decided_at__gte=_start_of(filters.since))
    if filters.until:
        rows = rows.filter(decided_at__lt=_start_of(filters.until + timedelta(days=1)))
    if filters.kind:
        rows = rows.filter(kind=filters.kind)
    if filters.outcome:
        rows = rows.filter(OUTCOMES[filters.outcome][1])
    return rows


def decided_page(
    filters: HistoryFilters, *, older: str | None = None, newer: str | None = None, size: int = 25
) -> KeysetPage[Approval]:
    """One page of decided items, the newest decision first."""
    return keyset_page(
        decided_query(filters), older=older, newer=newer, size=size, field="decided_at"
    )


@dataclass
class HistoryEntry:
    """One line of an item's history: who did what, when, and why."""

    at: datetime | None
    who: str
    what: str
    reason: str = ""  # what the agent was told (and may pass on to the customer)
    diff: dict | None = None  # an approval with edits: argument -> {from, to} (redacted)
    internal_note: str = ""  # the decider's note for staff (the inbox's pages are staff's)


def history_of(approval: Approval) -> list[HistoryEntry]:
    """What happened to an item, in order: the request (or the hand-over), each person's
    decision (the prefetched decision rows, with the edits they made, their reason and internal
    note), then how it ended when no person's decision ended it (expired, reconciled,
    withdrawn)."""
    requested = approval.visible_args()
    handover = approval.kind == ApprovalKind.HANDOVER
    asked = (
        "handed the request over to a person"
        if handover
        else f"asked to {tool_label(approval.tool)}"  # "asked to refund"
    )
    entries = [HistoryEntry(approval.created_at, "the agent", asked)]
    rows = list(approval.decisions.all())
    for row in rows:
        diff = None
        if row.decision == DecisionKind.APPROVE:
            diff = args_diff(requested, approval.redacted(row.args or {})) if row.edited else None
            what = "approved with edits" if diff else "approved"
        else:
            what = "closed the hand-over" if row.decision == DecisionKind.CLOSE else "rejected"
        entries.append(
            HistoryEntry(row.decided_at, row.username, what, row.reason, diff, row.internal_note)
        )
    ended_by_a_person = approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED) or (
        handover and approval.status == ApprovalStatus.RESOLVED
    )
    if not (ended_by_a_person and rows):
        what = {"withdrawn": "withdrew it"}.get(approval.resolution) or (
            f"reconciled: {approval.resolution}" if approval.resolution else approval.status
        )
        who = approval.decided_by_name or "the system"
        entries.append(
            HistoryEntry(
                approval.decided_at, who, what, approval.reason, None, approval.internal_note
            )
        )
    return entries


# ------------------------------------------------------------------ an approved call not made
_REFUSED = "refused: "
_NOT_MADE = "; the call was not made"


def not_made(approval: Approval) -> str:
    """Why an approved call was not made, in words ("" when it was made, has not run yet, or
    the item is no approval)."""
    if approval.kind != ApprovalKind.APPROVAL or approval.status != ApprovalStatus.APPROVED:
        return ""
    step = approval.step
    result = step.result if isinstance(step.result, dict) else {}
    if step.status == StepStatus.SUCCEEDED and result.get("already_done"):
        when = moment_text(result.get("done_at"))
        earlier = result.get("result") if isinstance(result.get("result"), dict) else {}
        if earlier.get("outcome_unknown"):
            return "it may have been done already (never confirmed), so it was not done again"
        return f"it was already done{' on ' + when if when else ''}, so it was not done again"
    if step.status == StepStatus.REJECTED:
        why = (step.error or "").removeprefix(_REFUSED).removesuffix(_NOT_MADE).strip()
        return f"refused when it was about to run: {why}" if why else "refused when about to run"
    if step.status == StepStatus.FAILED:
        return f"it failed: {step.error}" if step.error else "it failed"
    if step.status == StepStatus.SKIPPED:
        return "it was skipped"
    return ""


def not_made_verb(tool: str) -> str:
    """ "paid" for a tool that moves an amount (its `amount_arg`), "made" for any other."""
    return "paid" if has_tool(tool) and get_tool(tool).amount_arg else "made"


def not_made_label(approval: Approval) -> str:
    """ "approved, not paid: it was already done on Dec 6, 09:14, ..." ("" when it was made)."""
    why = not_made(approval)
    return f"approved, not {not_made_verb(approval.tool)}: {why}" if why else ""
