"""A lead allows one more execution of an operation key (a second partial refund): atomic and
audited (the allowance row names who, when and why; the run it was given for gets an
`operation.allowed` event in the same transaction)."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from agentruns.models import OperationAllowance, Run
from agentruns.registry.operations import check_key
from agentruns.runtime.events import EventType
from agentruns.runtime.execution import transitions
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.runtime.operations.executions import AllowanceRefused, allow_one_more
from agentruns.runtime.values.ids import actor_name

ALLOW_PERMISSION = "agentruns.operate_run"


def allow_operation(
    key: str, *, user: Any, reason: str = "", run_id: uuid.UUID | str | None = None
) -> OperationAllowance:
    """One more execution of `key` may run. Needs `agentruns.operate_run` (PermissionDenied);
    a bad key is a ValueError; nothing to allow (never executed, or an allowance still unused)
    is ActionRefused. `run_id`: the run whose blocked call it is for (its timeline says so)."""
    if not user.has_perm(ALLOW_PERMISSION):
        raise PermissionDenied(f"permission denied: {ALLOW_PERMISSION} is required")
    key = check_key(key)
    reason = reason.strip()[:500]
    with transaction.atomic():
        run = None
        if run_id is not None:
            run = Run.objects.filter(id=run_id).only("id").first()
            if run is None:
                raise ActionRefused(f"no run {run_id}")
        try:
            allowance = allow_one_more(key, user=user, reason=reason, run_id=run and run.id)
        except AllowanceRefused as exc:
            raise ActionRefused(str(exc)) from None
        if run is not None:
            data = {"key": key, "slot": allowance.slot, "by": actor_name(user), "reason": reason}
            transitions.apply(
                run.id, transitions.RunChange({}, [(EventType.OPERATION_ALLOWED, data)])
            )
    return allowance
