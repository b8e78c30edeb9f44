"""What a person needs to decide an inbox item without clicking away.

The runtime knows nothing about orders or customers (it must not import `support`), so a card
reads the facts the run itself gathered: its input and the results of the tool steps before the
parked one (a `lookup_order` result carries `customer_name` and `currency`, for example). All of
it comes from two batched queries per page, never one per card. Across runs, what the call's
tool declares as its context and its operation key's state (approvals/domain/context.py: two
more queries per page, plus the tools' own reads).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.urls import reverse
from django.utils import timezone

from agentruns.models import Step, StepAttempt, StepKind
from agentruns.registry.deployed import cannot_run
from agentruns.selectors.calls import (
    CUSTOMER_KEYS,
    ORDER_KEYS,
    call_in_words,
    deployed_tool,
    first_text,
    tool_label,
)
from agentruns.web.layout.navigation import record_url
from approvals.domain.context import contexts
from approvals.domain.decisions import args_diff
from approvals.domain.history import not_made, not_made_label
from approvals.domain.policy import waiting_for
from approvals.models import Approval, ApprovalDecision, ApprovalKind, ApprovalStatus
from approvals.web.amounts import Money, currency_of, money_of
from approvals.web.arguments import ArgRow, FormField, arg_rows, schema_fields, shown_diff
from approvals.web.context_view import ContextView, context_view

log = logging.getLogger(__name__)

# how many earlier steps of a run a card looks at (the customer facts and recent model text)
CONTEXT_STEPS = 12
# how many of the model's recent messages a card shows
RECENT_MODEL_TEXTS = 3

TICKET_KEYS = ("ticket_id",)

# an item's pages and forms (their URL names) and its run's page: each reversed once per page
# with a stand-in id, then filled in per card (a page of 25 cards asked `reverse` 150 times)
ITEM_URL_NAMES = {
    "item": "approval-item",
    "decide": "approval-decide",
    "claim": "approval-claim",
    "release": "approval-release",
    "allow": "approval-allow",
}
RUN_URL_NAME = "run-detail"
_STAND_IN_ID = "987654321"
_STAND_IN_RUN = uuid.UUID("98765432-1098-4765-8321-098765432109")


@dataclass(frozen=True)
class CardLinks:
    """Where a card's links and forms go."""

    item: str
    decide: str
    claim: str
    release: str
    allow: str
    run: str


def _links_of(approvals: list[Approval]) -> dict[int, CardLinks]:
    shapes = {key: reverse(name, args=[_STAND_IN_ID]) for key, name in ITEM_URL_NAMES.items()}
    run_shape = reverse(RUN_URL_NAME, args=[_STAND_IN_RUN])
    return {
        a.id: CardLinks(
            **{key: shape.replace(_STAND_IN_ID, str(a.id)) for key, shape in shapes.items()},
            run=run_shape.replace(str(_STAND_IN_RUN), str(a.run_id)),
        )
        for a in approvals
    }


@dataclass
class Card:
    approval: Approval
    args: dict  # redacted, what the agent asked for
    fields: list[FormField]
    waited_seconds: float
    reason_given: str
    amount: str | None
    amount_cents: int | None
    currency: str
    order_id: str | None
    customer: str | None
    request_text: str  # what the run was asked to do (the customer's message, for example)
    recent_text: list[str]  # the model's recent messages before it parked
    attempt: StepAttempt | None = None  # reconciliation: the attempt whose outcome is unknown
    diff: dict = field(default_factory=dict)  # edited: name -> {from, to}, amounts as shown
    # the two-person rule: this round's approvals, and who may still decide, in words
    given: list[ApprovalDecision] = field(default_factory=list)
    waiting_for: str = ""
    # why the deployed code cannot run this call (a deploy removed its tool or agent, or its
    # schema changed): the card says so and offers only a rejection
    cannot_run: str = ""
    # why this call needs a person although its tool's rule may not say so (a fork repeating its
    # source's side effect, a retry that skipped an unknown outcome): the run's snapshot says
    asked_because: str = ""
    # across runs (approvals/domain/context.py): what the tool declares, the call's operation
    # key and the other pending items of that key (the API's `context`), and its lines
    context: dict | None = None
    context_view: ContextView | None = None
    # the arguments as they stand now (the current proposal), for the card's table
    rows: list[ArgRow] = field(default_factory=list)
    # the tool's amount argument and its currency (None: no amount, or no currency known)
    money: Money | None = None
    # the customer's request the item is about (its ticket), when the run names one, and the
    # page a domain app shows it on (a hand-over is finished there)
    ticket_id: str | None = None
    ticket_url: str = ""
    # an approved call that was not made (approvals/domain/history.py): why, and the whole line
    not_made: str = ""
    not_made_label: str = ""
    # what the call does, in words: "refund" (the tool's label), "refund 327.32 USD to Jun Sato"
    label: str = ""
    what: str = ""
    links: CardLinks | None = None

    @property
    def given_user_ids(self) -> list[int]:
        return [d.user_id for d in self.given if d.user_id]

    @property
    def changeable(self) -> str:
        """What an approver may change, in words: "the amount or the reason"."""
        labels = [f"the {f.label.lower()}" for f in self.fields if f.editable]
        return " or ".join([", ".join(labels[:-1]), labels[-1]] if len(labels) > 1 else labels)

    # the card's parts that are the same for every viewer and every moment are cached by
    # everything they show (`_item.html`), so each is rendered once per change, not once per
    # page and person; who may do what, the CSRF tokens, "you", claims and the times that move
    # with the clock ("waiting 3 min", overdue, due in) are rendered every time
    @property
    def fields_fingerprint(self) -> str:
        """The edit form: the item's id and its fields (what it may change derives from them)."""
        return _fingerprint((self.approval.id, self.fields))

    @cached_property
    def shown_fingerprint(self) -> str:
        """The card's head (its status chip, customer, order, amount, what it asks and its
        links) and its body (the request, the agent's messages and reason, the question or the
        call with its rows, and what it meets across runs): everything they show."""
        a = self.approval
        return _fingerprint(
            (
                (a.id, a.status, a.kind, a.resolution, a.priority, a.agent, a.tool, a.run_id),
                (a.step.index, a.question, a.choices),
                (self.not_made, self.not_made_label, self.label, self.links),
                (self.customer, self.order_id, self.amount, self.amount_cents),
                (self.ticket_id, self.ticket_url, self.request_text, self.recent_text),
                (self.reason_given, self.args, self.rows, self.context_view),
            )
        )

    @property
    def call_fingerprint(self) -> str:
        """The call as the agent made it: its rows, tool, step, run and operation key."""
        a = self.approval
        key = self.context_view.key if self.context_view is not None else None
        return _fingerprint((self.rows, self.args, a.tool, a.step.index, a.run_id, key))

    @property
    def is_handover(self) -> bool:
        return self.approval.kind == ApprovalKind.HANDOVER

    @property
    def not_made_short(self) -> str:
        """The chip of an approved call that was not made: "approved, not paid"."""
        return self.not_made_label.split(":", 1)[0]


class EarlierStep(NamedTuple):
    """A step before the parked one, as a card reads it."""

    kind: str
    text: str
    result: Any


def _fingerprint(shown: Any) -> str:
    return hashlib.blake2b(repr(shown).encode(errors="surrogatepass"), digest_size=16).hexdigest()


def _context_steps(approvals: list[Approval]) -> dict[Any, list[EarlierStep]]:
    """Up to CONTEXT_STEPS steps before each parked step, newest first, in ONE query."""
    if not approvals:
        return {}
    # one condition per parked step index, naming its runs (a page's items park at a few
    # indexes): a pair of conditions per item, OR-ed one by one, cost more to build and compile
    # than the query takes to run
    runs_before: dict[int, list[Any]] = defaultdict(list)
    for a in approvals:
        runs_before[a.step.index].append(a.run_id)
    before = Q(
        *(Q(index__lt=index, run_id__in=runs) for index, runs in runs_before.items()),
        _connector=Q.OR,
    )
    rows = (
        Step.objects.filter(before)
        .annotate(
            recent=Window(RowNumber(), partition_by=[F("run_id")], order_by=F("index").desc())
        )
        .filter(recent__lte=CONTEXT_STEPS)
        .order_by("run_id", "-index")
        .values_list("run_id", "kind", "text", "result")
    )
    # plain rows, not models: a page reads up to 300 of them, and a model each cost more to
    # build than the query took
    by_run: dict[Any, list[EarlierStep]] = defaultdict(list)
    for run_id, kind, text, result in rows:
        by_run[run_id].append(EarlierStep(kind, text, result))
    return by_run


def _unknown_attempts(approvals: list[Approval]) -> dict[Any, StepAttempt]:
    """The latest attempt of each reconciliation step, in ONE query (none if no such item)."""
    step_ids = [a.step_id for a in approvals if a.kind == ApprovalKind.RECONCILIATION]
    if not step_ids:
        return {}
    latest: dict[Any, StepAttempt] = {}
    for attempt in StepAttempt.objects.filter(step_id__in=step_ids).order_by("step_id", "number"):
        latest[attempt.step_id] = attempt
    return latest


def build_cards(approvals: Iterable[Approval]) -> list[Card]:
    """Cards for a page of approvals (loaded with select_related run/step/decided_by)."""
    approvals = list(approvals)
    context = _context_steps(approvals)
    attempts = _unknown_attempts(approvals)
    across = contexts(approvals)
    links = _links_of(approvals)
    cards = [
        _safe_card(a, context.get(a.run_id, []), attempts.get(a.step_id), across.get(a.id))
        for a in approvals
    ]
    for card in cards:
        card.context = across.get(card.approval.id)
        card.context_view = context_view(card.context)
        card.links = links[card.approval.id]
    return cards


def _safe_card(
    approval: Approval, earlier: list[EarlierStep], attempt: StepAttempt | None, across: dict | None
) -> Card:
    """One item's card; an item the deployed code cannot read (a tool whose schema or edit policy
    changed under its parked arguments) gets a plain card saying so: one bad row never breaks
    the inbox."""
    try:
        return _card(approval, earlier, attempt, across)
    except Exception as exc:  # anything a changed tool definition can throw at the form
        log.warning("approval %s: card without its form: %r", approval.id, exc)
        return Card(
            approval=approval,
            args=approval.visible_args(),
            fields=[],
            waited_seconds=(timezone.now() - approval.created_at).total_seconds(),
            reason_given="",
            amount=None,
            amount_cents=None,
            currency="",
            order_id=None,
            customer=None,
            request_text="",
            recent_text=[],
            attempt=attempt,
            cannot_run=cannot_run_now(approval)
            or f"the deployed code cannot read this item ({type(exc).__name__}): reject it",
        )


def cannot_run_now(approval: Approval) -> str:
    """For a pending approval: why the deployed code could not execute it ("" when it can)."""
    if approval.status != ApprovalStatus.PENDING or approval.kind != ApprovalKind.APPROVAL:
        return ""
    return cannot_run(approval.agent, approval.tool, approval.effective_args)


def _shown_amount(cents: int | None, currency: str) -> str | None:
    return Money("", currency).show(cents) if cents is not None else None


def ticket_id_of(approval: Approval) -> str | None:
    """The ticket the item's call or run names (its arguments first, then the run's input)."""
    run_input = approval.run.input if isinstance(approval.run.input, dict) else {}
    return first_text([approval.requested_args, run_input], TICKET_KEYS)


def card_for(approval: Approval) -> Card:
    return build_cards([approval])[0]


def _amount(approval: Approval, money: Money | None) -> int | None:
    """The proposal's amount (the tool's `amount_arg`, else `amount_cents`) when an integer."""
    if money is None:
        return approval.amount_cents
    amount = approval.effective_args.get(money.arg)
    return amount if isinstance(amount, int) and not isinstance(amount, bool) else None


def _card(
    approval: Approval, earlier: list[EarlierStep], attempt: StepAttempt | None, across: dict | None
) -> Card:
    run = approval.run
    hidden = approval.hidden_fields
    requested = approval.visible_args()
    run_input = run.input if isinstance(run.input, dict) else {}
    # newest facts first: a later lookup wins over an earlier one, the args over both
    results = [s.result for s in earlier if s.kind == StepKind.TOOL and isinstance(s.result, dict)]
    sources = [approval.requested_args, *results, run_input]
    tool = deployed_tool(approval.tool)
    currency = currency_of(tool, approval.effective_args, across, sources)
    money = money_of(tool, currency)
    amount_cents = _amount(approval, money)
    texts = [s.text.strip() for s in earlier if s.kind == StepKind.MODEL and s.text.strip()]
    request_text = run_input.get("message") if isinstance(run_input.get("message"), str) else ""
    ticket_id = first_text([approval.requested_args, run_input, *results], TICKET_KEYS)
    if not request_text and run_input:
        request_text = json.dumps(run_input, ensure_ascii=False)[:500]
    diff: dict = {}
    proposal = requested
    if approval.edited_args is not None:
        proposal = approval.redacted(approval.edited_args)
        diff = shown_diff(args_diff(requested, proposal), money)
    return Card(
        approval=approval,
        args=requested,
        fields=schema_fields(approval, proposal, hidden, money),
        rows=arg_rows(requested, proposal, money),
        waited_seconds=(timezone.now() - approval.created_at).total_seconds(),
        reason_given=str(approval.requested_args.get("reason", "")),
        amount=_shown_amount(amount_cents, currency),
        amount_cents=amount_cents,
        currency=currency,
        order_id=first_text(sources, ORDER_KEYS),
        customer=first_text([*results, run_input], CUSTOMER_KEYS),
        request_text=request_text,
        recent_text=list(reversed(texts[:RECENT_MODEL_TEXTS])),
        attempt=attempt,
        diff=diff,
        given=approval.current_approvals() if approval.is_multi else [],
        waiting_for=waiting_for(approval) if approval.status == "pending" else "",
        cannot_run=cannot_run_now(approval),
        asked_because=str(run.tool_permission(approval.tool).get("approval_because") or ""),
        money=money,
        ticket_id=ticket_id,
        ticket_url=record_url("ticket_id", ticket_id),
        not_made=not_made(approval),
        not_made_label=not_made_label(approval),
        label=tool_label(approval.tool),
        what=call_in_words(approval.tool, proposal, [proposal, *results, run_input], currency),
    )
