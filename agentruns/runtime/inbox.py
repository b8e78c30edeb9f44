"""What the runtime needs from an inbox (DESIGN.md 4): the port an inbox app provides.

The runtime parks a step for a person, hands a run's request over to one when it ends,
withdraws what a cancel leaves undecided, has due items expired and escalated by the sweeper,
reports a failed run, has the inbox forget the runs the retention purge deletes, runs the
inbox's delivery loop in the worker and lets the chat endpoint answer an approval. It never
imports the app that does
these: the app registers its implementation at start-up (`AppConfig.ready`, approvals/apps.py),
and every call is a plain synchronous call inside the caller's transaction (no signals, which
could be lost between the runtime's write and the inbox's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from agentruns.models import Run, Step


class Refused(Exception):
    """The inbox refused a decision asked through the runtime's doors (the chat): an HTTP status
    and a code for scripts, as the inbox's own doors answer."""

    def __init__(self, message: str, status: int, code: str = "") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Inbox(Protocol):
    """The inbox, as the runtime sees it. Every method runs inside the caller's transaction."""

    #: the table of inbox items (a `status` column, "pending" while open): the navigation
    #: counts it in the same one query as the runs
    table: str

    def open_approval(self, step: Step, agent: str) -> int:
        """Park `step` for a person's decision; returns the new item's id."""

    def open_reconciliation(self, step: Step, agent: str) -> int:
        """The step's outcome is unknown: a person says what happened; returns the item's id."""

    def open_handover(self, step: Step, agent: str) -> int | None:
        """The run handed its request over to a person with this step (a successful call of a
        `handover=True` tool, registry/outcomes/): an item a person picks up and closes.
        Returns the new item's id, or None when the step has one already."""

    def open_question(
        self, step: Step, agent: str, *, token: str, question: str, choices: list[str] | None
    ) -> int:
        """The run asks a person `question` with this call's step (`ask_human`): an item whose
        answer resolves the wait on `token`; returns the item's id."""

    def question_calls(self, run: Run, call_ids: list[str]) -> set[str]:
        """Which of `call_ids` are calls of the run that asked a person a question."""

    def answer_question(self, run: Run, call_id: str, *, user: Any, answer: str) -> int:
        """Answer the run's question asked by the call `call_id` as `user` (the chat); returns
        the item's id. One answered first is left as it is (no error: the chat shows it)."""

    def approved_call_refusal(self, step: Step) -> str:
        """Why an approved call must not run as it is now ("" when it may)."""

    def approval_of(self, step: Step) -> dict[str, Any] | None:
        """The decision that let an approved call run, for the call's `ToolContext.approval`:
        `by`, `at`, `reason`, `requested` and `approved` arguments (None: none on record)."""

    def withdraw(self, run: Run, *, reason: str) -> list[int]:
        """Take the run's pending items out of the inbox; returns their ids."""

    def expire_due(self, now: datetime) -> int:
        """Items past their expiry are rejected as expired; returns how many."""

    def escalate_due(self, now: datetime) -> int:
        """Items past their due time are escalated, each exactly once; returns how many."""

    def run_failed(self, run_id: Any, fields: dict[str, Any]) -> None:
        """A run failed: the outside world hears of it (webhooks), in the failing transaction."""

    def agent_said(
        self, run_id: Any, thread_id: str, *, asked: bool, message_id: str, text: str, sent_at: Any
    ) -> None:
        """The agent answered a message of a thread, or asked its customer (`asked`: `text` is
        the question): the outside world hears of it (webhooks), in the transaction storing it."""

    def forget_runs(self, run_ids: list, *, dry_run: bool) -> dict[str, int]:
        """The retention purge removes these finished runs: delete the inbox's rows for them
        that no foreign key ties to a run or its steps (those go with the runs, by cascade), or
        only count them (`dry_run`); returns {table: rows}."""

    def delivery_loop(self) -> threading.Thread:
        """The worker's loop delivering the inbox's notifications (not started; it has a
        `stopped` event to end it)."""

    def answer(
        self, run: Run, approval_id: int, *, approved: bool, user: Any, reason: str, version: int
    ) -> str:
        """A person's answer to one of the run's approvals (the chat): "decided", "decided
        earlier" (somebody else, or a repeat) or "stale" (a newer version is on the table).
        Raises `Refused` for anything else (no such item, no right, a rule of the inbox)."""

    def metric_families(self, now: datetime) -> Iterator[Any]:
        """The inbox's figures for the on-call metrics (prometheus_client families)."""


_registered: Inbox | None = None


def register(inbox: Inbox) -> None:
    """Called once by the inbox app at start-up; a second registration replaces the first."""
    global _registered
    _registered = inbox


def inbox() -> Inbox:
    """The registered inbox; loudly missing when no inbox app is installed."""
    if _registered is None:
        raise RuntimeError("no inbox is registered: is the approvals app in INSTALLED_APPS?")
    return _registered
