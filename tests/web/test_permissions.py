"""agentruns.operate_run guards every action on the run page (the API:
tests/api/test_permissions.py)."""

from __future__ import annotations

import pytest

from agentruns.models import RunStatus, Step
from tests.helpers import event_types, script_run
from tests.testkit import OPS_AGENT, failed_shipping_run

pytestmark = pytest.mark.django_db


def test_viewer_cannot_operate_from_the_page(client, viewer, approver):
    run = failed_shipping_run(parcel="P-9", final_text="done")
    queued = script_run([{"text": "x"}], agent=OPS_AGENT)
    ship = Step.objects.get(run=run, tool="ops_ship")
    before = event_types(run)
    for user in (viewer, approver):  # deciding approvals is not operating runs
        client.force_login(user)
        page = client.get(f"/runs/{run.id}/").content.decode()
        assert "Retry from failed step" not in page and "Mark step resolved" not in page
        assert client.post(f"/runs/{run.id}/retry/").status_code == 403
        assert client.post(f"/runs/{queued.id}/cancel/").status_code == 403
        assert client.post(f"/runs/steps/{ship.id}/resolve/", {"result": "{}"}).status_code == 403
    run.refresh_from_db()
    queued.refresh_from_db()
    assert run.status == RunStatus.FAILED and queued.status == RunStatus.QUEUED
    assert event_types(run) == before


def test_operator_operates_from_the_page(client, operator):
    client.force_login(operator)
    run = failed_shipping_run(parcel="P-9", final_text="done")
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Retry from failed step" in page and "Mark step resolved" in page

    ship = Step.objects.get(run=run, tool="ops_ship")
    response = client.post(f"/runs/steps/{ship.id}/resolve/", {"result": '{"tracking": "T-1"}'})
    assert response.status_code == 302 and response["Location"].endswith(
        f"/runs/{run.id}/#step-{ship.index}"
    )
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert "step.resolved" in event_types(run)

    queued = script_run([{"text": "x"}], agent=OPS_AGENT)
    response = client.post(
        f"/runs/{queued.id}/cancel/", {"reason": "duplicate ticket"}, follow=True
    )
    assert response.status_code == 200 and b"Cancel requested" in response.content
    queued.refresh_from_db()
    assert queued.status == RunStatus.CANCELLED and queued.error == "duplicate ticket"

    # a refused action is a message on the page, not an error page
    response = client.post(f"/runs/{queued.id}/retry/", follow=True)
    assert response.status_code == 200 and b"only failed runs can be retried" in response.content


def test_resolve_with_bad_json_changes_nothing(client, operator):
    client.force_login(operator)
    run = failed_shipping_run(parcel="P-9", final_text="done")
    ship = Step.objects.get(run=run, tool="ops_ship")
    response = client.post(f"/runs/steps/{ship.id}/resolve/", {"result": "{not json"}, follow=True)
    assert b"not valid JSON" in response.content
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "step.resolved" not in event_types(run)


def test_actions_need_post_and_login(client, operator):
    run = failed_shipping_run(parcel="P-9", final_text="done")
    assert client.post(f"/runs/{run.id}/retry/").status_code == 302  # to the login page
    client.force_login(operator)
    assert client.get(f"/runs/{run.id}/retry/").status_code == 405
    assert client.get(f"/runs/{run.id}/cancel/").status_code == 405
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
