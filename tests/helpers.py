"""Helpers every kind of test uses: drive a run in-process, read its steps and events."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone

from agentruns.models import Run, RunEvent, Step
from agentruns.runtime.executor import RunExecutor
from agentruns.services import start_run


def script_run(turns: list[dict], agent: str = "script", **run_input: object) -> Run:
    """Start (queue) a run of a scripted test agent (tests/testkit.py) that plays `turns`."""
    return start_run(agent, {"script": turns, **run_input}).run


def leased_run(owner: str = "me:1:abc", ttl_seconds: float = 30) -> Run:
    """A run of the `script` agent (never enqueued) as a worker holds it: running, leased to
    `owner` for `ttl_seconds`."""
    run = start_run("script", {"script": []}, enqueue_task=False).run
    Run.objects.filter(id=run.id).update(
        status="running",
        lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
    )
    return Run.objects.get(id=run.id)


def advance(run: Run) -> Run:
    """Execute the run in this process (as a worker would) until it finishes, parks or yields."""
    RunExecutor(run.id).advance()
    run.refresh_from_db()
    return run


def _run_id(run: Run | uuid.UUID | str) -> uuid.UUID | str:
    return run.id if isinstance(run, Run) else run


def steps(run: Run | uuid.UUID | str, kind: str = "") -> list[Step]:
    """The run's steps in order; only those of `kind` ("model" or "tool") if given."""
    rows = Step.objects.filter(run_id=_run_id(run)).order_by("index")
    return list(rows.filter(kind=kind) if kind else rows)


def events(run: Run | uuid.UUID | str, *types: str) -> list[RunEvent]:
    """The run's events in seq order; only those of `types` if given."""
    rows = RunEvent.objects.filter(run_id=_run_id(run)).order_by("seq")
    return list(rows.filter(type__in=types) if types else rows)


def event_types(run: Run | uuid.UUID | str) -> list[str]:
    return [event.type for event in events(run)]


def assert_gapless(run: Run | uuid.UUID | str) -> None:
    """The run's events are seq 1..last_seq: no hole, no duplicate."""
    run_id = _run_id(run)
    last_seq = Run.objects.values_list("last_seq", flat=True).get(id=run_id)
    seqs = list(
        RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    assert last_seq == len(seqs)


def assert_json_error(response, status: int) -> dict:
    """Every API error is JSON `{"error": ...}` with the given 4xx status."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"]
    return body
