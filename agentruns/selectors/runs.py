"""Reads: kept here so views and the consumer share one definition of each query."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import connection

from agentruns.models import Run, RunEvent, RunStatus, Step
from agentruns.runtime.inbox import inbox

# every GET /api/runs/<id> (a client polling its run) reads it, written out: the ORM's building
# of the query cost more than the database's answer; `raw()` converts columns as it does
_RUN_SQL = f"SELECT * FROM {Run._meta.db_table} WHERE id = %s"


def get_run(run_id: uuid.UUID | str) -> Run | None:
    found = list(Run.objects.raw(_RUN_SQL, [Run._meta.pk.get_db_prep_value(run_id, connection)]))
    return found[0] if found else None


def run_by_dedupe_key(agent: str, dedupe_key: str) -> Run | None:
    """The run started for (agent, dedupe_key), if any: the unique constraint makes it one."""
    return Run.objects.filter(agent=agent, dedupe_key=dedupe_key).first()


def run_steps(run: Run) -> list[Step]:
    return list(Step.objects.filter(run=run).order_by("index"))


def run_step(run: Run, index: int) -> Step | None:
    return Step.objects.filter(run=run, index=index).first()


def events_after(run_id: uuid.UUID | str, after: int, limit: int = 1000) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit])


NAV_STATUSES = ("failed", "waiting", "running", "queued")
NAV_COUNT_CAP = 1000


def nav_counts() -> dict:
    """Per-status run counts and pending approvals for the navigation, in ONE query.

    Each count stops at NAV_COUNT_CAP (a LIMIT inside the subquery, answered from the status
    index), so the navigation costs the same on every page whether 10 or 10 million runs failed;
    a capped count shows as "999+".
    """
    run_table = connection.ops.quote_name(Run._meta.db_table)
    approval_table = connection.ops.quote_name(inbox().table)
    parts, params = [], []
    for key, table in [*((s, run_table) for s in NAV_STATUSES), ("pending", approval_table)]:
        parts.append(
            f"SELECT %s, (SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE status = %s LIMIT %s) c)"
        )
        params += [key, key, NAV_COUNT_CAP]
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        counts = {key: int(n) for key, n in cursor.fetchall()}

    def shown(n: int) -> int | str:
        return f"{NAV_COUNT_CAP - 1}+" if n >= NAV_COUNT_CAP else n

    return {
        "runs": {s: shown(counts.get(s, 0)) for s in NAV_STATUSES},
        "pending_approvals": shown(counts.get("pending", 0)),
    }


def waiting_line(run: Run) -> str:
    """What a run waiting in its concurrency key's line (or its thread's) waits for, as a person
    reads it ("" for any other run): the run ahead of it, and the key (runtime/dispatch/)."""
    if run.waiting_behind is None:
        return ""
    if run.concurrency_key is None:
        return (
            f"waiting behind run {str(run.waiting_behind)[:8]}: the thread's turn before it "
            "(one run of a thread at a time)"
        )
    return (
        f"waiting behind run {str(run.waiting_behind)[:8]}: {run.agent} runs on "
        f"{run.concurrency_key} take turns, in start order"
    )


def backoff_of(run: Run, events: list[RunEvent]) -> dict | None:
    """A queued run waiting out a backoff (a model outage, a tool's retry): why, and when it
    tries next, from its latest status event."""
    if run.status != RunStatus.QUEUED:
        return None
    latest = next((e for e in reversed(events) if e.type == "run.status"), None)
    data = latest.data if latest is not None else {}
    if data.get("status") != RunStatus.QUEUED or not data.get("until"):
        return None
    try:
        until = datetime.fromisoformat(data["until"])
    except (TypeError, ValueError):
        return None
    return {"reason": data.get("reason", ""), "until": until}
