"""agentruns.operate_run guards retry and cancel in the API as on the page
(tests/web/test_permissions.py)."""

from __future__ import annotations

import json

import pytest

from agentruns.models import Run, RunStatus
from tests.helpers import ApiClient, advance, script_run
from tests.testkit import OPS_AGENT, failed_shipping_run

pytestmark = pytest.mark.django_db


def test_viewer_cannot_operate_through_the_api(viewer):
    run = failed_shipping_run(parcel="P-9", final_text="done")
    queued = script_run([{"text": "x"}], agent=OPS_AGENT)
    api = ApiClient(viewer)
    for path in (f"/api/runs/{run.id}/retry", f"/api/runs/{queued.id}/cancel"):
        response = api.post(path)
        assert response.status_code == 403
        assert response["Content-Type"] == "application/json"
        assert "operate_run" in response.json()["error"]
    run.refresh_from_db()
    queued.refresh_from_db()
    assert run.status == RunStatus.FAILED and queued.status == RunStatus.QUEUED


def test_operator_retries_and_cancels_through_the_api(operator):
    api = ApiClient(operator)
    run = failed_shipping_run(parcel="P-9", final_text="done")
    response = api.post(f"/api/runs/{run.id}/retry")
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert api.post(f"/api/runs/{run.id}/retry").status_code == 409  # queued now: not failed
    run = advance(Run.objects.get(id=run.id))
    assert run.status == RunStatus.SUCCEEDED

    queued = script_run([{"text": "x"}], agent=OPS_AGENT)
    response = api.post(f"/api/runs/{queued.id}/cancel", {"reason": "test"})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "cancelled" and body["error"] == "test"
    conflict = api.post(f"/api/runs/{queued.id}/cancel")
    assert conflict.status_code == 409 and "already cancelled" in conflict.json()["error"]
    bad = api.post(f"/api/runs/{queued.id}/cancel", raw="{nope")
    assert bad.status_code == 400 and "error" in json.loads(bad.content)
