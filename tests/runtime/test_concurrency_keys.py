"""Concurrency keys (runtime/dispatch/concurrency.py) in this process on PostgreSQL."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus
from agentruns.registry import Agent, register_agent
from agentruns.runtime.dispatch import claims
from agentruns.runtime.execution import transitions
from agentruns.services import start_run
from tests.helpers import advance
from tests.testkit import TOOLS, script_policy

pytestmark = pytest.mark.django_db(transaction=True)

register_agent(
    Agent(name="keyed", instructions="Follow the script.", tools=TOOLS, scripted_policy=script_policy),
    concurrency_key=lambda run_input: run_input.get("order"),
    concurrency=1,
)


def keyed(order: str = "ORD-1", turns: list | None = None) -> Run:
    return start_run("keyed", {"script": turns or [{"text": "done"}], "order": order}).run


def fresh(run: Run) -> Run:
    run.refresh_from_db()
    return run


def test_smoke():
    a, b, c = keyed(), keyed(), keyed()
    other = keyed("ORD-2")
    assert fresh(a).holds_key and fresh(a).waiting_behind is None
    assert fresh(b).waiting_behind == a.id and fresh(b).enqueued_at is None
    assert fresh(c).waiting_behind == b.id
    assert fresh(other).holds_key
    taken = claims.claim_queued(10, transitions.started().events)
    assert {r.id for r in taken} == {a.id, other.id}
    from agentruns.runtime.execution.executor import RunExecutor
    for r in taken:
        RunExecutor(r.id, r.lease_owner).advance(claimed=r)
    assert fresh(a).status == RunStatus.SUCCEEDED and not fresh(a).holds_key
    assert fresh(b).holds_key and fresh(b).waiting_behind is None and fresh(b).enqueued_at
    assert fresh(c).waiting_behind == b.id
    assert advance(b).status == RunStatus.SUCCEEDED
    assert fresh(c).holds_key
    assert advance(c).status == RunStatus.SUCCEEDED
