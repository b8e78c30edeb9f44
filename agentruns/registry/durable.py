"""What a Pydantic AI tool declares for the engine: its `metadata["agentruns"]` dict.

    @agent.tool_plain(metadata=durable(side_effect=True, idempotency="key", amount_arg="cents",
                                       operation_key=lambda args: f"refund:{args['order_id']}"))

`durable(...)` only builds (and checks) the dict; the plain dict works the same. Undeclared tools
are side-effect free. MCP tools take their defaults from the server's annotations
(`annotation_defaults`), which a registration's declaration overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

METADATA_KEY = "agentruns"
# the keys a declaration may hold, mapped onto `agentruns.registry.Tool` fields
KEYS = frozenset(
    {
        "side_effect",
        "idempotency",
        "transactional",
        "editable",
        "approvals_required",
        "amount_arg",
        "redact",
        "retry",
        "requires_approval",
        "escalate_after",
        "operation_key",
        "limit",
        "context",
        "currency_arg",
        "handover",
        "handover_closed",
        "scope_arg",
        "label",
    }
)


def durable(
    *,
    side_effect: bool | None = None,
    idempotency: Literal["key", "none"] | None = None,
    transactional: bool | None = None,
    editable: Mapping[str, Any] | None = None,
    approvals_required: int | Callable[[dict], int] | None = None,
    amount_arg: str | None = None,
    redact: Sequence[str] | None = None,
    retry: Any = None,
    requires_approval: bool | Callable[[dict], bool] | None = None,
    escalate_after: float | None = None,
    operation_key: Callable[[dict], str] | None = None,
    limit: Callable[[dict], Any] | None = None,
    context: Callable[[dict], dict] | None = None,
    currency_arg: str | None = None,
    handover: bool | None = None,
    handover_closed: Callable[[Any], None] | None = None,
    scope_arg: str | None = None,
    label: str | None = None,
) -> dict[str, dict[str, Any]]:
    """`{"agentruns": {...}}` for a Pydantic AI tool's `metadata=` (only the keys given)."""
    given = {k: v for k, v in locals().items() if v is not None}
    return {METADATA_KEY: check_declaration(given, where="durable()")}


def check_declaration(declared: Any, *, where: str) -> dict[str, Any]:
    """The declaration as a dict, or ValueError naming the unknown key or the bad value."""
    if not isinstance(declared, Mapping):
        raise ValueError(f"{where}: metadata[{METADATA_KEY!r}] must be a dict")
    unknown = sorted(set(declared) - KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown} in metadata[{METADATA_KEY!r}] "
            f"(known: {sorted(KEYS)})"
        )
    if declared.get("idempotency", "key") not in ("key", "none"):
        raise ValueError(f"{where}: idempotency must be 'key' or 'none'")
    return dict(declared)


def declaration_of(metadata: Mapping[str, Any] | None, *, where: str) -> dict[str, Any]:
    """The engine's declaration in a tool definition's metadata ({} when it has none)."""
    declared = (metadata or {}).get(METADATA_KEY)
    return {} if declared is None else check_declaration(declared, where=where)


def annotation_defaults(annotations: Mapping[str, Any] | None) -> dict[str, Any]:
    """MCP tool annotations (hints) -> the engine's defaults: `readOnlyHint` no side effect (run
    again after a crash); otherwise a side effect that needs approval, `idempotentHint` run again
    with the same key after a crash, else an unknown outcome reconciled in the inbox."""
    hints = dict(annotations or {})
    if hints.get("readOnlyHint"):
        return {"side_effect": False}
    return {
        "side_effect": True,
        "requires_approval": True,
        "idempotency": "key" if hints.get("idempotentHint") else "none",
    }
