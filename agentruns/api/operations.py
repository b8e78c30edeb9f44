"""`GET /api/operation-keys/<key>` and `POST /api/operation-keys/<key>/allow` (DESIGN.md 4.13):
what a key's next call meets, and a lead's "one more execution" (a second partial refund)."""

from __future__ import annotations

from django.http import HttpRequest

from agentruns import services
from agentruns.api.endpoint import RUN_ID, endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import COUNT, TEXT_OR_NULL, TIME, TIME_OR_NULL, obj
from agentruns.models.operations import KEY_MAX
from agentruns.registry import OperationKeyError
from agentruns.registry.operations import check_key
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.operations import key_payload, key_state
from agentruns.services.operations import ALLOW_PERMISSION

KEY_PATH = {"key": {"type": "string", "minLength": 1, "maxLength": KEY_MAX, "pattern": "^[^/]+$"}}
OPERATION_KEY = obj(
    {
        "key": {"type": "string"},
        "status": {"type": "string", "enum": ["free", "held", "used"]},
        "allowed": COUNT,
        "executions": {
            "type": "array",
            "items": obj(
                {
                    "slot": COUNT,
                    "state": {"type": "string", "enum": ["held", "done", "released"]},
                    "run_id": {"type": "string", "format": "uuid"},
                    "step_id": {"type": "string", "format": "uuid"},
                    "tool": {"type": "string"},
                    "at": TIME,
                    "settled_at": TIME_OR_NULL,
                    "result": {},
                }
            ),
        },
        "allowances": {
            "type": "array",
            "items": obj(
                {
                    "slot": COUNT,
                    "by": TEXT_OR_NULL,
                    "at": TIME,
                    "reason": {"type": "string"},
                    "run_id": TEXT_OR_NULL,
                }
            ),
        },
    }
)


@endpoint(
    "GET",
    "/operation-keys/{key}",
    summary="An operation key: its executions, allowances, and what its next call meets",
    permission="agentruns.view_run",
    path_params=KEY_PATH,
    tags=("operation keys",),
    returns=OPERATION_KEY,
)
def operation_key(request: HttpRequest, key: str) -> dict:
    return key_payload(key_state(_checked(key)))


@endpoint(
    "POST",
    "/operation-keys/{key}/allow",
    summary="Allow one more execution of an operation key (e.g. a second partial refund)",
    permission=ALLOW_PERMISSION,
    path_params=KEY_PATH,
    body={"reason": {"type": "string", "maxLength": 500}, "run_id": RUN_ID},
    responses={
        201: "allowed: the key's next call runs",
        403: "no right to allow (agentruns.operate_run)",
        409: "nothing to allow: never executed, or one more is already allowed and unused",
    },
    tags=("operation keys",),
    returns=obj(
        {"allowed": obj({"slot": COUNT, "by": TEXT_OR_NULL, "at": TIME}), "key": OPERATION_KEY}
    ),
    example={"reason": "the customer returned a second item"},
)
def allow_operation(request: HttpRequest, key: str, body: dict) -> tuple[dict, int]:
    allowance = services.allow_operation(
        _checked(key), user=request.user, reason=body.get("reason", ""), run_id=body.get("run_id")
    )
    allowed = {"slot": allowance.slot, "by": allowance.granted_by_name or None}
    allowed["at"] = iso(allowance.created_at)
    return {"allowed": allowed, "key": key_payload(key_state(key))}, 201


def _checked(key: str) -> str:
    try:
        return check_key(key)
    except OperationKeyError as exc:
        raise BadRequest(str(exc), 404) from None
