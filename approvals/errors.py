"""Every refusal of a decision or a claim, in one place, with the HTTP status each door answers.

`DecisionError` is the base of the refusals a door shows as a 4xx (its `status`, 422 unless the
class says otherwise, and a `code` for scripts: the bulk results, the chat, the API).
`AlreadyDecided` is not one: a late decision is told who decided first and when.
"""

from __future__ import annotations

from typing import Any

from agentruns.runtime.values.ids import actor_name
from agentruns.runtime.values.timestamps import iso
from approvals.models import Approval


class AlreadyDecided(Exception):
    """Somebody (or the sweeper, or a cancel) decided first; nothing was changed."""

    def __init__(self, approval: Approval) -> None:
        self.approval = approval
        self.who = actor_name(approval.decided_by) or "the system"
        self.when = approval.decided_at
        when = self.when.isoformat(timespec="seconds") if self.when else "earlier"
        if approval.resolution == "withdrawn":
            what = f"withdrawn ({approval.reason})" if approval.reason else "withdrawn"
        elif approval.resolution:
            what = f'resolved as "{approval.resolution}"'
        else:
            what = str(approval.status)
        super().__init__(f"already {what} by {self.who} at {when}")


class DecisionError(Exception):
    """The decision is not acceptable as given (bad arguments, over the approver's limit).
    `code` names the reason for scripts (the bulk API's per-item results)."""

    status = 422

    def __init__(self, message: str, code: str = "not_acceptable") -> None:
        super().__init__(message)
        self.code = code


class NoteRequired(DecisionError):
    """A rejection (or a hand-over's close) with neither a reason nor an internal note."""

    status = 400
    fields = ("reason", "internal_note")

    def __init__(self, decision: str = "reject") -> None:
        what = "to close a hand-over" if decision == "close" else "to reject"
        super().__init__(
            "Give a reason (the agent is told it and may pass it on to the customer) or an "
            f"internal note (for staff only), or both, {what}",
            code="note_required",
        )


class AnswerRefused(DecisionError):
    """A question's answer that cannot be taken: empty, or not one of the question's choices."""

    status = 400
    fields = ("answer",)


class NotAllowed(DecisionError):
    """This person may not make this decision (separation of duties, their limit)."""

    status = 403


class AlreadyGiven(DecisionError):
    """This person already approved this round: someone else must give the next approval."""

    status = 409


class EditNotAllowed(DecisionError):
    """An edit outside the tool's edit policy or schema; nothing was recorded."""

    status = 400

    def __init__(self, field: str, rule: str, message: str) -> None:
        super().__init__(message, code="edit_not_allowed")
        self.field, self.rule = field, rule


class LimitExceeded(DecisionError):
    """Approving would go over a limit that adds up: the tool's own (an order's refunds against
    what was paid: 422, `over_limit`) or the approver's total per day (403, `over_daily_limit`).
    `figures`: the numbers behind the sentence, for scripts."""

    def __init__(self, message: str, code: str, figures: dict, status: int = 422) -> None:
        super().__init__(message, code=code)
        self.figures, self.status = figures, status


class NotRunnable(DecisionError):
    """The deployed code cannot execute this call (its agent or tool is gone, or the arguments
    no longer fit the tool's schema): approving is refused, rejecting is not."""

    status = 409


class StaleProposal(DecisionError):
    """The decision was made on an older version of the proposal: nothing was recorded. Carries
    the item as it is now, so the door can show the current proposal."""

    status = 409

    def __init__(self, approval: Approval, seen: int | None) -> None:
        self.approval, self.seen, self.current = approval, seen, approval.version
        seen_text = f"version {seen}" if seen else "a version you did not name"
        super().__init__(
            f"the proposal changed since you saw it (you decided on {seen_text}, it is now "
            f"version {approval.version}): review the current proposal and decide again",
            code="stale_version",
        )


class ClaimedByOther(Exception):
    """Somebody else holds the item (and their claim has not lapsed)."""

    def __init__(self, approval: Approval, holder: Any) -> None:
        self.approval = approval
        self.holder = holder.get_username()
        self.since = approval.claimed_at
        self.until = approval.claim_expires_at
        super().__init__(
            f"{self.holder} is on this item since {iso(self.since)} "
            f"(the claim lapses at {iso(self.until)} unless renewed)"
        )


def status_of(exc: DecisionError) -> int:
    """The HTTP status of a refused decision (the API's, and the inbox's X-Decision-Status)."""
    return exc.status


def error_details(exc: DecisionError) -> dict:
    if isinstance(exc, LimitExceeded):
        return {"code": exc.code, "figures": exc.figures}
    if isinstance(exc, NoteRequired | AnswerRefused):
        return {"code": exc.code, "fields": list(exc.fields)}
    return {"field": exc.field, "rule": exc.rule} if isinstance(exc, EditNotAllowed) else {}
