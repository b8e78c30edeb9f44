"""Priority and concurrency keys at the doors (issue 30): `POST /api/runs`, the chat and the
start form take a bounded `priority` (a bad one is a JSON 400 naming the field, nothing started;
above the default it needs `agentruns.set_priority` or an operator's right, issue 46);
a run waiting in its concurrency key's line says which run it waits behind in its JSON, in the
runs list (API and page) and on its page, escaped; the OpenAPI document describes both.

The engine's side (admission, claims, the index): tests/runtime/test_concurrency_keys.py."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from prometheus_client.parser import text_string_to_metric_families

from agentruns.api.openapi import openapi_document
from agentruns.health import METRICS_CACHE_KEY
from agentruns.models import Run
from tests.api.test_openapi import check
from tests.conftest import ApiClient, make_user
from tests.helpers import assert_json_error

pytestmark = pytest.mark.django_db


def refund(api: ApiClient, order: str = "ORD-1001", **body) -> dict:
    response = api.post(
        "/api/runs", {"agent": "refund", "input": {"order_id": order, "message": "broken"}, **body}
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_priority_is_taken_reported_and_bounded(api):
    assert refund(api, priority=7)["priority"] == 7
    assert refund(api, "ORD-1002")["priority"] == 0
    assert refund(api, "ORD-1003", priority=-100)["priority"] == -100
    made = Run.objects.count()
    for bad in (101, -101, "high", 1.5, True, None, [1]):
        error = assert_json_error(
            api.post("/api/runs", {"agent": "refund", "input": {"order_id": "X"}, "priority": bad}),
            400,
        )["error"]
        assert "'priority'" in error, (bad, error)
    assert Run.objects.count() == made
    assert sorted(Run.objects.values_list("priority", flat=True)) == [-100, 0, 7]


def test_a_run_in_its_keys_line_says_which_run_it_waits_behind(api):
    first, second = refund(api), refund(api)
    assert first["waiting_behind"] is None and first["concurrency_key"] == "ORD-1001"
    assert second["status"] == "queued" and second["waiting_behind"] == first["id"]
    assert f"waiting behind run {first['id'][:8]}" in second["waiting_reason"]
    assert api.get(f"/api/runs/{second['id']}").json()["waiting_behind"] == first["id"]
    listed = {r["id"]: r for r in api.get("/api/runs").json()["runs"]}
    assert listed[second["id"]]["waiting_behind"] == first["id"]
    assert "waiting behind" in listed[second["id"]]["waiting_reason"]
    assert listed[first["id"]]["waiting_reason"] is None
    document = openapi_document()
    check(document, "/api/runs/{run_id}", "get", api.get(f"/api/runs/{second['id']}"))
    check(document, "/api/runs", "get", api.get("/api/runs"))


def test_metrics_count_runs_in_line_apart_from_the_queue(api, client):
    refund(api), refund(api), refund(api, "ORD-1002")
    cache.delete(METRICS_CACHE_KEY)
    body = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["agentruns_runs_waiting_in_line"].samples[0].value == 1
    assert families["agentruns_queue_depth"].samples[0].value == 2  # claimable ones only


def test_the_pages_say_it_too_escaped(client, lead, api):
    first = refund(api, "<i>O-1</i>")
    second = refund(api, "<i>O-1</i>", priority=3)
    client.force_login(lead)
    page = client.get(f"/runs/{second['id']}/").content.decode()
    assert f"waiting behind run {first['id'][:8]}" in page
    assert f'href="/runs/{first["id"]}/"' in page
    assert "&lt;i&gt;O-1&lt;/i&gt;" in page and "<i>O-1</i>" not in page
    assert 'id="priority">3<' in page
    listing = client.get("/runs/").content.decode()
    assert "waiting behind" in listing and "<i>O-1</i>" not in listing


def test_the_chat_and_the_form_take_a_priority(client, django_user_model):
    chatter = make_user(
        django_user_model,
        "chatter",
        ["agentruns.view_run", "agentruns.start_run", "agentruns.set_priority"],
    )
    api = ApiClient(chatter)
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund please"}]}
    body = {"id": "c1", "messages": [message], "input": {"order_id": "ORD-1001"}}
    bad = assert_json_error(api.post("/api/chat/refund", {**body, "priority": 1000}), 400)
    assert "'priority'" in bad["error"] and not Run.objects.exists()
    streamed = api.post("/api/chat/refund", {**body, "priority": 9})
    assert streamed.status_code == 200
    assert Run.objects.get(id=streamed["x-run-id"]).priority == 9

    client.force_login(chatter)
    form = {"agent": "refund", "input": '{"order_id": "ORD-1002"}', "priority": "-4"}
    assert client.post("/runs/new/", form).status_code == 302
    assert Run.objects.get(input__order_id="ORD-1002").priority == -4
    refused = client.post("/runs/new/", {**form, "priority": "4.5"})
    assert refused.status_code == 400 and b"priority must be" in refused.content
    assert Run.objects.filter(input__order_id="ORD-1002").count() == 1


def test_a_priority_above_the_default_is_a_permission(client, django_user_model):
    """The audit's trainee set `"priority": 100` (its runs claimed first): above 0 needs
    `agentruns.set_priority` (or an operator's right), by every door; others get 403 naming it,
    and nothing starts. Below the default anyone may."""
    trainee = make_user(django_user_model, "trainee", ["agentruns.view_run", "agentruns.start_run"])
    api = ApiClient(trainee)
    order = {"order_id": "ORD-1001", "message": "refund please"}
    for door, body in [
        ("/api/runs", {"agent": "refund", "input": order, "priority": 100}),
        ("/api/runs", {"agent": "refund", "input": order, "priority": 1, "thread": True}),
        (
            "/api/threads/t-prio/messages",
            {"text": "refund please", "agent": "refund", "input": order, "priority": 100},
        ),
        (
            "/api/chat/refund",
            {
                "id": "c-prio",
                "messages": [
                    {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "x"}]}
                ],
                "input": order,
                "priority": 100,
            },
        ),
    ]:
        refused = assert_json_error(api.post(door, body), 403)
        assert "agentruns.set_priority" in refused["error"], (door, refused)
    assert not Run.objects.exists()
    client.force_login(trainee)
    form = client.get("/runs/new/").content.decode()
    assert 'max="0"' in form and "agentruns.set_priority" in form  # the form offers what works
    page = client.post(
        "/runs/new/",
        {"agent": "refund", "input": '{"order_id": "ORD-1002"}', "priority": "100"},
    )
    assert page.status_code == 403 and b"agentruns.set_priority" in page.content
    assert not Run.objects.exists()
    assert refund(api, priority=-5)["priority"] == -5  # letting others go first is anyone's
    assert refund(api, "ORD-1002")["priority"] == 0

    for perms in (["agentruns.set_priority"], ["agentruns.operate_run"]):
        allowed = make_user(
            django_user_model,
            f"may-{perms[0]}",
            ["agentruns.view_run", "agentruns.start_run", *perms],
        )
        assert refund(ApiClient(allowed), "ORD-1003", priority=100)["priority"] == 100


def test_the_openapi_document_describes_priority_and_the_line():
    document = openapi_document()
    paths = document["paths"]

    def body_schema(path: str) -> dict:
        return paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    for path in ("/api/runs", "/api/chat/{agent}"):
        priority = body_schema(path)["properties"]["priority"]
        assert (priority["type"], priority["minimum"], priority["maximum"]) == (
            "integer",
            -100,
            100,
        )
    run = paths["/api/runs/{run_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    properties = run["schema"]["properties"]
    assert {"priority", "waiting_behind", "waiting_reason", "concurrency_key"} <= set(properties)
