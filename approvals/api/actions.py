"""`POST /api/approvals/<id>/claim`, `/release` and `POST /api/approvals/bulk` (DESIGN.md 6)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest

from agentruns.api.endpoint import INT_ID, endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import obj
from agentruns.runtime.values.ids import BadId, parse_id
from agentruns.runtime.values.timestamps import iso
from approvals import services
from approvals.api.approvals import APPROVAL, already_decided, approval_payload
from approvals.domain import claims
from approvals.errors import (
    AlreadyDecided,
    ClaimedByOther,
    DecisionError,
    error_details,
    status_of,
)
from approvals.models import Approval


def _claim_action(action: Callable[..., Approval], approval_id: str, request: HttpRequest) -> dict:
    """Claim or release: the same answers for no such item, someone else's claim, decided."""
    try:
        return approval_payload(action(int(approval_id), user=request.user))
    except Approval.DoesNotExist:
        raise BadRequest("no such approval", 404) from None
    except ClaimedByOther as exc:
        raise _claimed_by_other(exc) from None
    except AlreadyDecided as exc:  # only a claim: releasing a decided item is a no-op
        raise already_decided(exc) from None
    except DecisionError as exc:  # no right to see what a claim answers with
        raise BadRequest(str(exc), status_of(exc), code=exc.code) from None


def _claimed_by_other(exc: ClaimedByOther) -> BadRequest:
    return BadRequest(
        str(exc),
        409,
        claimed_by=exc.holder,
        claimed_at=iso(exc.since),
        claim_expires_at=iso(exc.until),
        approval=approval_payload(exc.approval),
    )


CLAIM_RESPONSES = {
    200: "the approval, with claimed_by",
    403: "no right to decide",
    404: "no such approval",
    409: "claimed by someone else (who, since when) or already decided",
}


@endpoint(
    "POST",
    "/approvals/{approval_id}/claim",
    summary='Claim an item ("I\'m on it"); claiming your own again renews it',
    permission="approvals.decide_approval",
    path_params={"approval_id": INT_ID},
    responses=CLAIM_RESPONSES,
    tags=("approvals",),
    returns=APPROVAL,
)
def approval_claim(request: HttpRequest, approval_id: str) -> dict:
    return _claim_action(claims.claim, approval_id, request)


@endpoint(
    "POST",
    "/approvals/{approval_id}/release",
    summary="Release your claim on an item (a no-op when nobody holds it)",
    permission="approvals.decide_approval",
    path_params={"approval_id": INT_ID},
    responses=CLAIM_RESPONSES,
    tags=("approvals",),
    returns=APPROVAL,
)
def approval_release(request: HttpRequest, approval_id: str) -> dict:
    return _claim_action(claims.release, approval_id, request)


@endpoint(
    "POST",
    "/approvals/bulk",
    summary="Approve or reject many items with one reason (and note): one result per id",
    permission="approvals.decide_approval",
    body={
        "ids": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "minItems": 1,
            "maxItems": services.MAX_ITEMS,
        },
        "decision": {"type": "string", "enum": list(services.BULK_DECISIONS)},
        "reason": {"type": "string", "maxLength": 2000},
        # for staff only, kept on every item decided (rejecting needs a reason or a note)
        "internal_note": {"type": "string", "maxLength": 2000},
        # id -> the `version` of the proposal selected; an id without one is decided as the
        # single API decides one without a version
        "versions": {
            "type": "object",
            "maxProperties": services.MAX_ITEMS,
            "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        },
    },
    required=("ids", "decision"),
    responses={
        200: "a result per id (ok, or code and error; stale_version with the current version)",
        400: "a key of versions that is not an id; a rejection without a reason or an "
        "internal note (`fields`)",
        403: "no right to decide or to see the items",
    },
    tags=("approvals",),
    returns=obj(
        {
            "results": {
                "type": "array",
                "items": obj(
                    {
                        "id": {"type": ["integer", "null"]},
                        "ok": {"type": "boolean"},
                        "status": {"type": "string"},
                        "result": {"type": "string"},
                        "code": {"type": "string"},
                        "error": {"type": "string"},
                        "version": {"type": "integer"},
                    },
                    optional=("status", "result", "code", "error", "version"),
                ),
            },
            "summary": {"type": "object"},
        }
    ),
)
def approval_bulk(request: HttpRequest, body: dict) -> dict:
    """Each item is its own decision (its own compare-and-set and limit check); no edits.
    Codes: already_decided, above_limit, wrong_kind (a reconciliation), not_found,
    needs_second_approver (recorded, waiting for another approver), stale_version (the
    proposal changed since it was selected: `version` is the current one), not_runnable."""
    try:
        versions = {
            parse_id(key, what="versions key"): value
            for key, value in body.get("versions", {}).items()
        }
    except BadId as exc:
        raise BadRequest(str(exc)) from None
    try:
        results = services.decide_many(
            body["ids"],
            decision=body["decision"],
            user=request.user,
            reason=body.get("reason", ""),
            versions=versions,
            internal_note=body.get("internal_note", ""),
        )
    except DecisionError as exc:
        raise BadRequest(
            str(exc), status_of(exc), **{"code": exc.code, **error_details(exc)}
        ) from None
    return {"results": results, "summary": services.summary(results)}
