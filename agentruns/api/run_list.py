"""`GET /api/runs`: the runs page's list for integrations (DESIGN.md 6).

The same filters as the page (status, agent, q over the agent's search fields) plus the starter
and a creation window, the same keyset pages (`selectors/pagination.py`, newest first; `next`
is the `older=` cursor of the following page, `newer` the one of the page before), the same
permission. A filter or cursor that cannot be read is a 400, never an empty or first page that
would look like an answer.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.http import HttpRequest
from django.utils.dateparse import parse_datetime

from agentruns.api.endpoint import endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import RUN_LIST
from agentruns.api.serializers import run_summary_payload
from agentruns.models import Run, RunStatus, WaitKind
from agentruns.selectors import RunFilters, run_page
from agentruns.selectors.pagination import decode_cursor, parse_uuid
from agentruns.selectors.people import username_lookup

VIEW = "agentruns.view_run"
CURSOR = {"type": "string", "pattern": "^[0-9]{1,18}-[0-9a-fA-F-]{32,36}$"}
AGENT_MAX = Run._meta.get_field("agent").max_length
TIME = {"type": "string", "format": "date-time", "maxLength": 40}


def _moment(raw: str | None, name: str) -> datetime | None:
    if raw is None:
        return None
    try:
        moment = parse_datetime(raw)
    except ValueError:
        moment = None
    if moment is None:
        raise BadRequest(f"{name} must be an ISO 8601 date-time (2026-12-01T09:30:00Z)")
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        # in UTC: PostgreSQL refuses offsets beyond 15:59 that Python accepts (a 500 otherwise)
        return moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+05:00 is before the first representable UTC
        raise BadRequest(f"{name} is out of range") from None


def _cursor(raw: str | None, name: str) -> str:
    if raw is not None and decode_cursor(raw, parse_uuid) is None:
        raise BadRequest(f"{name} is not a cursor of this list (use the `next` of a page)")
    return raw or ""


@endpoint(
    "GET",
    "/runs",
    summary="Runs, newest first, filtered, in keyset pages (the runs page's list)",
    permission=VIEW,
    query={
        "status": {"type": "string", "enum": RunStatus.values},
        # waiting runs by what they wait for (selectors/waiting.py)
        "waiting_for": {"type": "string", "enum": list(WaitKind.values)},
        # what the work came to (`refund_rejected`, `handed_over`, ...; registry/outcomes/)
        "outcome": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,39}$"},
        "agent": {"type": "string", "minLength": 1, "maxLength": AGENT_MAX},
        "created_by": {"type": "string", "minLength": 1, "maxLength": 150},
        "q": {"type": "string", "minLength": 1, "maxLength": 100},
        "created_after": TIME,
        "created_before": TIME,
        "older": CURSOR,
        "newer": CURSOR,
        "limit": {"type": "integer", "minimum": 1, "maximum": 200},
    },
    tags=("runs",),
    returns=RUN_LIST,
)
def list_runs(
    request: HttpRequest,
    status: str = "",
    waiting_for: str = "",
    outcome: str = "",
    agent: str = "",
    created_by: str = "",
    q: str = "",
    created_after: str | None = None,
    created_before: str | None = None,
    older: str | None = None,
    newer: str | None = None,
    limit: int = 50,
) -> dict:
    filters = RunFilters(
        status=status,
        waiting_for=waiting_for,
        outcome=outcome,
        agent=agent,
        q=q.strip(),
        created_by=created_by,
        created_after=_moment(created_after, "created_after"),
        created_before=_moment(created_before, "created_before"),
    )
    page = run_page(
        filters,
        older=_cursor(older, "older"),
        newer=_cursor(newer, "newer"),
        size=limit,
        fields=(username_lookup("created_by"), "trace_id"),
    )
    return {
        "runs": [run_summary_payload(run) for run in page.items],
        "next": page.older,
        "newer": page.newer,
    }
