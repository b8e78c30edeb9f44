"""The run page's "Permissions" section: the snapshot frozen at start, in words."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentruns.api.serializers import permissions_payload
from agentruns.models import Run


@dataclass
class ToolPermissionRow:
    tool: str
    allowed: bool
    why: str  # which groups' policies allow it, or that no policy applies
    approval: str
    limits: str


def _approval_words(entry: dict) -> str:
    own = entry.get("tool_approval", "predicate")
    words = {True: "always", False: "never", "predicate": "when the tool's rule says so"}
    text = words.get(own, str(own))
    if entry.get("approval") == "always":
        text = f"always ({entry.get('approval_because') or 'policy'})"
    approvals = entry.get("approvals", 1)
    if approvals == "predicate":
        text += "; approvers needed: by the call (two-person rule)"
    elif isinstance(approvals, int) and approvals > 1:
        text += f"; {approvals} approvers needed"
    return text


def _limit_words(entry: dict) -> str:
    limits = entry.get("limits")
    if not limits:
        return ""
    default = limits.get("default")
    parts = [f"{group}: {limit}" for group, limit in sorted(limits.get("groups", {}).items())]
    parts.append(f"others: {default if default else 'no limit'}")
    return f"{entry.get('amount_arg')} up to " + ", ".join(parts)


def permission_view(run: Run) -> dict:
    snapshot = permissions_payload(run)
    rows = []
    for name, entry in (snapshot.get("tools") or {}).items():
        allowed_by = entry.get("allowed_by")
        if allowed_by is None:
            why = "no tool policy applies"
        elif allowed_by:
            why = "allowed by " + ", ".join(allowed_by)
        else:
            why = "no policy of the starter's groups allows it"
        rows.append(
            ToolPermissionRow(
                tool=name,
                allowed=bool(entry.get("allowed", True)),
                why=why,
                approval=_approval_words(entry),
                limits=_limit_words(entry),
            )
        )
    taken = snapshot.get("taken_at")
    return {
        "user": snapshot.get("user"),
        "groups": snapshot.get("groups") or [],
        "policies": snapshot.get("policies") or [],
        "taken_at": datetime.fromisoformat(taken) if taken else None,
        "rows": rows,
    }
