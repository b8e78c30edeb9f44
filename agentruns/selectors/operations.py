"""Operation keys as the API, the inbox and the run page show them (runtime/operations)."""

from __future__ import annotations

from typing import Any

from agentruns.models import OperationExecution
from agentruns.registry import get_tool, has_tool
from agentruns.runtime.operations.executions import (
    KeyState,
    held_arguments,
    key_state,
    key_states,
)
from agentruns.runtime.values.redaction import redact_fields
from agentruns.runtime.values.timestamps import iso

__all__ = [
    "KeyState",
    "held_arguments",
    "key_payload",
    "key_state",
    "key_states",
    "shown_result",
]


def shown_result(row: OperationExecution) -> Any:
    """A call's result as people may see it (the deployed tool's secret fields masked)."""
    hidden = get_tool(row.tool).redact if has_tool(row.tool) else ()
    return redact_fields(row.result, hidden)


def key_payload(state: KeyState) -> dict[str, Any]:
    """`status`: what the key's next call meets (held: it waits; used: it is answered "already
    done"; free: it runs); `allowed`: executions allowed in all (1 + the leads' allowances)."""
    return {
        "key": state.key,
        "status": state.status,
        "allowed": state.slots,
        "executions": [
            {
                "slot": row.slot,
                "state": row.state,
                "run_id": str(row.run_id),
                "step_id": str(row.step_id),
                "tool": row.tool,
                "at": iso(row.created_at),
                "settled_at": iso(row.settled_at),
                "result": shown_result(row),
            }
            for row in state.executions
        ],
        "allowances": [
            {
                "slot": a.slot,
                "by": a.granted_by_name or None,
                "at": iso(a.created_at),
                "reason": a.reason,
                "run_id": str(a.run_id) if a.run_id else None,
            }
            for a in state.allowances
        ],
    }
