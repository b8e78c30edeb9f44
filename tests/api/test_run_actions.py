"""Resolve and fork through the JSON API: the same services, permission and refusals as the page."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunStatus, Step, StepStatus
from tests import testkit
from tests.helpers import ApiClient, advance, assert_json_error
from tests.testkit import failed_shipping_run, succeeded_run_to_fork

pytestmark = pytest.mark.django_db


def test_resolve_through_the_api_continues_the_run(api):
    run = failed_shipping_run()
    index = Step.objects.get(run=run, tool="ops_ship").index
    response = api.post(
        f"/api/runs/{run.id}/steps/{index}/resolve", {"result": {"tracking": "TRK-API"}}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued"
    step = next(s for s in body["steps"] if s["index"] == index)
    assert step["status"] == StepStatus.SUCCEEDED and step["result"] == {"tracking": "TRK-API"}
    run = advance(Run.objects.get(id=run.id))
    assert run.status == RunStatus.SUCCEEDED and len(testkit.CALLS["ops_ship"]) == 1
    # resolving it again is a conflict, not a 500
    assert_json_error(api.post(f"/api/runs/{run.id}/steps/{index}/resolve", {"result": {}}), 409)


def test_resolve_refusals_through_the_api(api, viewer):
    run = failed_shipping_run()
    index = Step.objects.get(run=run, tool="ops_ship").index
    url = f"/api/runs/{run.id}/steps/{index}/resolve"
    assert_json_error(ApiClient(viewer).post(url, {"result": {"x": 1}}), 403)
    assert_json_error(api.post(url, {"result": ["not", "an", "object"]}), 400)
    assert_json_error(api.post(url, {}), 400)
    assert_json_error(api.post(f"/api/runs/{run.id}/steps/99/resolve", {"result": {}}), 404)
    assert_json_error(
        api.post(f"/api/runs/{run.id}/steps/0/resolve", {"result": {}}), 409
    )  # a model step
    assert_json_error(api.get(url), 405)
    assert Step.objects.get(run=run, index=index).status == StepStatus.FAILED  # nothing changed
    assert Run.objects.get(id=run.id).status == RunStatus.FAILED


def test_fork_through_the_api(api, viewer):
    source = succeeded_run_to_fork()
    url = f"/api/runs/{source.id}/fork"
    assert_json_error(ApiClient(viewer).post(url, {"from_step": 2}), 403)
    assert_json_error(api.post(url, {"from_step": 1}), 409)  # a tool step
    assert_json_error(api.post(url, {"from_step": "2"}), 400)
    assert_json_error(api.post(url, {"from_step": True}), 400)
    assert Run.objects.count() == 1

    response = api.post(url, {"from_step": 2})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != str(source.id) and body["status"] == "queued"
    assert [s["index"] for s in body["steps"]] == [0, 1]
    # the answer lists the source's side effect it may repeat, which waits for approval
    assert [(r["index"], r["tool"], r["approval"]) for r in body["fork"]["repeats"]] == [
        (3, "t_charge", True)
    ]
    fork = advance(Run.objects.get(id=body["id"]))
    assert fork.status == RunStatus.WAITING and len(testkit.CALLS["t_charge"]) == 1
    approval = fork.approvals.get(tool="t_charge")
    assert api.post(f"/api/approvals/{approval.id}", {"decision": "approve"}).status_code == 200
    fork = advance(fork)
    assert fork.status == RunStatus.SUCCEEDED and fork.output == "done"
    assert len(testkit.CALLS["t_echo"]) == 1  # the copied history did not run again
