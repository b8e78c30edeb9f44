"""A question answered (an inbox item of kind `question`): the answer resolves the run's wait.

Under the item's row lock (services.decide): the item is still pending (a second answer gets
`AlreadyDecided`, naming who answered first and when), the answer is not empty (free text
is an answer even when the question offers choices), then the compare-and-set on the item (settle: the `question.answered`
webhook), the person's decision row, the audit event on the run's timeline and the wait's own
compare-and-set (`resolve_wait`), which queues the run once: its model reads the answer as the
call's result on its next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentruns.runtime import writer
from agentruns.runtime.events import EventType
from agentruns.runtime.execution.transitions import UnknownToken, WaitAlreadyResolved, resolve_wait
from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.domain.outcomes import decision_row, settle
from approvals.errors import AnswerRefused
from approvals.models import Approval, ApprovalKind, ApprovalStatus, DecisionKind

ANSWERED = "answered"
MAX_ANSWER = 4000


def check_answer(answer: str) -> str:
    """The answer as it is kept (AnswerRefused for none), before anything is locked."""
    answer = answer.strip()
    if not answer:
        raise AnswerRefused("Give an answer to the question", code="answer_required")
    if len(answer) > MAX_ANSWER:
        raise AnswerRefused(f"The answer is too long (at most {MAX_ANSWER} characters)")
    return answer


@dataclass
class Answered:
    """What `services.decide` carries out for an answered question (as an `Outcome`)."""

    approval: Approval
    user: Any
    answer: str

    def carry_out(self) -> bool:
        approval, by = self.approval, actor_name(self.user) or "the system"
        event = {
            "approval": approval.id,
            "kind": approval.kind,
            "step": approval.step.index,
            "tool": approval.tool,
            "decision": ANSWERED,
            "by": by,
            "at": iso(approval.decided_at),
            "question": approval.question,
            "answer": self.answer,
        }
        writer.append(approval.run_id, [(EventType.APPROVAL_DECIDED, event)])
        try:
            resolve_wait(approval.wait_token, {"answer": self.answer}, by=by)
        except (WaitAlreadyResolved, UnknownToken):
            return False  # (the run was cancelled or forked meanwhile: only the audit trail)
        return True


def answered(approval: Approval, user: Any, answer: str) -> Answered:
    # free text is always an answer (DESIGN.md 6): the choices are what the card offers first
    settle(
        approval,
        ApprovalKind.QUESTION,
        user,
        status=ApprovalStatus.RESOLVED,
        resolution=ANSWERED,
        answer=answer,
    )
    decision_row(approval, user, DecisionKind.ANSWER, reason=answer)
    return Answered(approval, user, answer)
