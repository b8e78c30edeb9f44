"""What became of an approved call: made, or not made although a person approved it.

An approval says a person agreed; it does not say the call happened. A call can be approved and
still not be made: its operation key was done meanwhile (it is answered "already done" with the
earlier execution), the tool's limit refused it right before it ran (another request filled the
order), or the deployed code refused it. Everywhere an approved item is listed (the card and the
item page, the decided view, the API's `not_made`) says so, so nobody reads "approved 327.32 USD"
where nothing was paid. Read from the item's step, which every listing loads with it.
"""

from __future__ import annotations

from agentruns.models import StepStatus
from agentruns.registry import get_tool, has_tool
from agentruns.runtime.values.timestamps import moment_text
from approvals.models import Approval, ApprovalKind, ApprovalStatus

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
