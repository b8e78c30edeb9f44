"""JSON API of runs (DESIGN.md 6): bearer auth, JSON errors with a 4xx (never HTML, never a 500),
run creation and its Idempotency-Key, run detail with steps, events after a seq, cancel/retry.
(The refund gateway's own endpoint: tests/support/test_gateway.py.)"""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from agentruns.models import Run, RunStatus, Step
from agentruns.runtime.engine.executor import RunExecutor
from tests.helpers import ApiClient, advance, assert_json_error, make_user, script_run

pytestmark = pytest.mark.django_db

REFUND_INPUT = {"order_id": "ORD-1001", "message": "The blender arrived broken"}


# ------------------------------------------------------------------ authentication
def test_no_token_is_401_json(client: Client):
    assert_json_error(client.get(f"/api/runs/{uuid.uuid4()}"), 401)
    response = client.post(
        "/api/runs",
        json.dumps({"agent": "refund", "input": REFUND_INPUT}),
        content_type="application/json",
    )
    assert_json_error(response, 401)
    assert Run.objects.count() == 0


def test_bad_token_is_401_json(client: Client, lead):
    for header in ("Bearer art_not-a-real-token", "Bearer ", "Basic dXNlcjpwdw=="):
        response = client.post(
            "/api/runs",
            json.dumps({"agent": "refund", "input": REFUND_INPUT}),
            content_type="application/json",
            HTTP_AUTHORIZATION=header,
        )
        assert_json_error(response, 401)
    assert Run.objects.count() == 0


def test_revoked_token_is_401(lead):
    from agentruns.models import ApiToken

    api = ApiClient(lead)
    assert api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT}).status_code == 201
    ApiToken.objects.update(revoked=True)
    assert_json_error(api.get(f"/api/runs/{uuid.uuid4()}"), 401)


# ------------------------------------------------------------------ creating runs
def test_malformed_json_is_400_json(api):
    assert_json_error(api.post("/api/runs", raw='{"agent": "refund", "input": '), 400)
    assert_json_error(api.post("/api/runs", raw="\xff\xfe not json"), 400)
    assert Run.objects.count() == 0


@pytest.mark.parametrize("raw", ['["refund"]', '"refund"', "42", "null"])
def test_body_must_be_an_object(api, raw):
    assert_json_error(api.post("/api/runs", raw=raw), 400)
    assert Run.objects.count() == 0


def test_missing_agent_and_non_object_input_are_400(api):
    assert_json_error(api.post("/api/runs", {"input": REFUND_INPUT}), 400)
    assert_json_error(api.post("/api/runs", {"agent": 7, "input": REFUND_INPUT}), 400)
    assert_json_error(api.post("/api/runs", {"agent": "refund", "input": ["ORD-1001"]}), 400)
    assert Run.objects.count() == 0


def test_unknown_agent_is_400_json(api):
    body = assert_json_error(api.post("/api/runs", {"agent": "no-such-agent", "input": {}}), 400)
    assert "no-such-agent" in body["error"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    "bad_input",
    [
        {},  # order_id is required
        {"order_id": 1001},  # wrong type
        {"order_id": "", "message": "x"},  # minLength
        {"order_id": "ORD-1001", "message": "x" * 6000},  # maxLength
    ],
)
def test_input_failing_the_agent_schema_is_400(api, bad_input):
    assert_json_error(api.post("/api/runs", {"agent": "refund", "input": bad_input}), 400)
    assert Run.objects.count() == 0


def test_create_run_returns_201_with_the_queued_run(api):
    response = api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT})
    assert response.status_code == 201
    body = response.json()
    run = Run.objects.get(id=body["id"])
    assert body["status"] == run.status == RunStatus.QUEUED
    assert body["agent"] == "refund" and body["input"] == REFUND_INPUT
    assert run.created_by.username == "lead"


def test_repeated_idempotency_key_returns_the_same_run(api):
    payload = {"agent": "refund", "input": REFUND_INPUT}
    first = api.post("/api/runs", payload, HTTP_IDEMPOTENCY_KEY="ticket-T-1001")
    again = api.post("/api/runs", payload, HTTP_IDEMPOTENCY_KEY="ticket-T-1001")
    other = api.post("/api/runs", payload, HTTP_IDEMPOTENCY_KEY="ticket-T-1002")
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert Run.objects.filter(dedupe_key="ticket-T-1001").count() == 1
    assert Run.objects.count() == 2


def test_overlong_idempotency_key_is_400(api):
    response = api.post(
        "/api/runs", {"agent": "refund", "input": REFUND_INPUT}, HTTP_IDEMPOTENCY_KEY="k" * 201
    )
    assert_json_error(response, 400)


def test_wrong_method_is_405_json(api):
    response = api.client.delete("/api/runs", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert_json_error(response, 405)
    assert response["Allow"] == "GET, POST"


# ------------------------------------------------------------------ reading runs
def test_run_detail_shows_steps(api):
    run = script_run(
        [
            {
                "text": "charging",
                "calls": [["t_echo", {"text": "hi"}], ["t_charge", {"amount": 5}]],
            },
            {"text": "all done"},
        ]
    )
    advance(run)
    response = api.get(f"/api/runs/{run.id}")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "succeeded" and body["output"] == "all done"
    rows = {s.index: s for s in Step.objects.filter(run=run)}
    assert [s["index"] for s in body["steps"]] == [0, 1, 2, 3]
    for step in body["steps"]:
        for field in (
            "index",
            "kind",
            "tool",
            "status",
            "attempts",
            "idempotency_key",
            "result",
            "error",
        ):
            assert field in step, field
        row = rows[step["index"]]
        assert step["idempotency_key"] == row.idempotency_key and step["idempotency_key"]
        assert step["attempts"] == row.attempts == 1
        assert step["status"] == "succeeded" and step["error"] is None
    assert [(s["kind"], s["tool"]) for s in body["steps"]] == [
        ("model", None),
        ("tool", "t_echo"),
        ("tool", "t_charge"),
        ("model", None),
    ]
    charge = body["steps"][2]
    assert charge["result"] == {"charged": 5, "key": charge["idempotency_key"]}


def test_failed_step_error_is_in_the_detail(api):
    run = script_run([{"calls": [["t_explode", {}]]}])
    advance(run)
    body = api.get(f"/api/runs/{run.id}").json()
    assert body["status"] == "failed"
    explode = body["steps"][1]
    assert explode["tool"] == "t_explode" and explode["status"] == "failed"
    assert "card declined" in explode["error"]


@pytest.mark.parametrize("path", ["not-a-uuid", "12345", "7f0c9a52-3d5e-4b8e-9c1a-2f6d8e4b1a07"])
def test_unknown_run_is_404_json(api, path):
    assert_json_error(api.get(f"/api/runs/{path}"), 404)
    assert_json_error(api.get(f"/api/runs/{path}/events?after=0"), 404)
    assert_json_error(api.post(f"/api/runs/{path}/cancel"), 404)
    assert_json_error(api.post(f"/api/runs/{path}/retry"), 404)


def test_events_after_seq_are_in_order(api):
    run = script_run(
        [{"text": "one two three", "calls": [["t_echo", {"text": "x"}]]}, {"text": "end"}]
    )
    advance(run)
    everything = api.get(f"/api/runs/{run.id}/events?after=0").json()["events"]
    seqs = [e["seq"] for e in everything]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 5
    assert everything[0]["type"] == "run.created"
    for after in (0, 2, len(seqs) - 1, len(seqs)):
        events = api.get(f"/api/runs/{run.id}/events?after={after}").json()["events"]
        assert [e["seq"] for e in events] == [s for s in seqs if s > after]
        assert all({"seq", "type", "data"} <= set(e) for e in events)
    assert api.get(f"/api/runs/{run.id}/events").json()["events"] == everything
    assert_json_error(api.get(f"/api/runs/{run.id}/events?after=abc"), 400)


# ------------------------------------------------------------------ cancel / retry
def test_viewer_may_not_cancel_or_retry(viewer):
    run = script_run([{"text": "x"}])
    api = ApiClient(viewer)
    assert api.get(f"/api/runs/{run.id}").status_code == 200
    assert_json_error(api.post(f"/api/runs/{run.id}/cancel"), 403)
    assert_json_error(api.post(f"/api/runs/{run.id}/retry"), 403)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_cancel_a_queued_run(api):
    run = script_run([{"text": "x"}])
    response = api.post(f"/api/runs/{run.id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    # the cancelled run is terminal: a second cancel is a conflict, not a 500
    assert_json_error(api.post(f"/api/runs/{run.id}/cancel"), 409)
    # a worker that still gets the task does nothing
    assert RunExecutor(run.id).advance() == "busy"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and not Step.objects.filter(run=run).exists()


def test_retry_of_a_run_that_did_not_fail_is_409(api):
    queued = script_run([{"text": "x"}])
    assert_json_error(api.post(f"/api/runs/{queued.id}/retry"), 409)
    done = script_run([{"text": "ok"}])
    advance(done)
    assert_json_error(api.post(f"/api/runs/{done.id}/retry"), 409)


def test_retry_of_a_failed_run_requeues_it(api):
    run = script_run([{"calls": [["t_explode", {}]]}])
    advance(run)
    response = api.post(f"/api/runs/{run.id}/retry")
    assert response.status_code == 200
    assert response.json()["status"] == "queued"


def test_cancel_and_retry_need_post(api):
    run = script_run([{"text": "x"}])
    assert_json_error(api.get(f"/api/runs/{run.id}/cancel"), 405)
    assert_json_error(api.get(f"/api/runs/{run.id}/retry"), 405)


# ------------------------------------------------------------------ permissions


def test_reading_runs_needs_view_permission(db, django_user_model):
    nobody = ApiClient(make_user(django_user_model, "nobody"))
    viewer = ApiClient(
        make_user(django_user_model, "looker", ["agentruns.view_run", "agentruns.start_run"])
    )
    run = viewer.post("/api/runs", {"agent": "script", "input": {"script": []}}).json()
    for path in (f"/api/runs/{run['id']}", f"/api/runs/{run['id']}/events?after=0"):
        refused = nobody.get(path)
        assert refused.status_code == 403 and "view_run" in refused.json()["error"]
        assert viewer.get(path).status_code == 200
