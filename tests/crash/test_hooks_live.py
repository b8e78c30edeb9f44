"""Hooks through real processes (issue 33 item 3): a real qcluster runs a run that waits on
`carrier:<order>` from inside its tool; a second run waiting on the same token fails that wait
at once with the holder's id; a real daphne takes `POST /api/hooks/<token>` twice (200 with the
run id, then 409 with the first resolution's time); the first run resumes in the worker with the
body exactly once and succeeds."""

from __future__ import annotations

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from agentruns.models import Run, RunStatus, Step
from agentruns.tokens import create_token
from tests.procs import start_web, start_worker, wait_until
from tests.pydantic_ai.kit import start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]
ENV = {"AGENTRUNS_AGENT_MODULES": "tests.runtime.wait_agents"}


def _status(run_id) -> str:
    return Run.objects.get(id=run_id).status


def test_a_hook_resolves_a_waiting_run_once_across_processes(tmp_path, procs):
    from tests.runtime import wait_agents  # noqa: F401  (registers pa-waits here too)

    carrier = get_user_model().objects.create_user("carrier-bot")
    carrier.user_permissions.add(*Permission.objects.filter(codename="resolve_hook"))
    web, url = start_web(tmp_path, **ENV)
    worker = start_worker(tmp_path, name="hooks", **ENV)
    procs.extend([web, worker])
    holder = start("pa-waits", ("await_delivery", {"order_id": "ORD-77"})).id
    wait_until(lambda: _status(holder) == RunStatus.WAITING, timeout=60, message="the holder waits")
    second = start("pa-waits", ("await_delivery", {"order_id": "ORD-77"})).id
    wait_until(lambda: _status(second) == RunStatus.SUCCEEDED, timeout=60, message="the second")
    tool = Step.objects.get(run_id=second, kind="tool")
    assert tool.result == {"held_by": str(holder)}  # failed at once, naming the holder

    api = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {create_token(carrier)}"}, timeout=30
    )
    first = api.post("/api/hooks/carrier:ORD-77", json={"status": "delivered", "at": "09:14"})
    assert first.status_code == 200, first.text
    assert first.json()["run_id"] == str(holder)
    again = api.post("/api/hooks/carrier:ORD-77", json={"status": "lost"})
    assert again.status_code == 409, again.text
    assert again.json()["resolved_at"] == first.json()["resolved_at"]
    wait_until(lambda: _status(holder) == RunStatus.SUCCEEDED, timeout=60, message="resumed")
    tool = Step.objects.get(run_id=holder, kind="tool")
    assert tool.result == {"event": {"status": "delivered", "at": "09:14"}}
    assert api.post("/api/hooks/carrier:ORD-77", json={}).status_code == 409  # still the first
