"""The API's one parsing path: every refusal is a JSON 4xx, and the routes match the declarations."""

from __future__ import annotations

import uuid

import pytest

from agentruns.models import Run
from tests.helpers import assert_json_error


@pytest.mark.django_db
def test_unknown_api_paths_and_methods_are_json(api):
    assert "no API route" in assert_json_error(api.get("/api/nope"), 404)["error"]
    assert "no API route" in assert_json_error(api.get("/api/runs/x/y/z/w"), 404)["error"]
    response = api.client.delete("/api/runs", HTTP_AUTHORIZATION=f"Bearer {api.token}")
    assert (
        "not allowed" in assert_json_error(response, 405)["error"]
        and response["Allow"] == "GET, POST"
    )


@pytest.mark.django_db
def test_a_malformed_id_is_a_json_404_before_any_query(api, django_assert_max_num_queries):
    with django_assert_max_num_queries(3):  # the token lookup and its last-used stamp only
        assert assert_json_error(api.get("/api/runs/not-a-uuid"), 404)["error"] == "no such run"
    assert (
        assert_json_error(api.post("/api/approvals/١٢", {"decision": "approve"}), 404)["error"]
        == "no such approval"
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw, fragment",
    [
        ('{"agent": "refund", "input": {"n": NaN}}', "NaN is not a JSON number"),
        ('{"agent": "refund", "input": {"n": 1e999}}', "out of range"),
        ('{"agent": "refund", "input": {"n": ' + "9" * 5000 + "}}", "too large"),
        ('{"agent": "refund", "input": {"n": 9223372036854775808}}', "out of range"),
        ('{"agent": "refund", "input": {"t": "a\\u0000b"}}', "NUL"),
        ('{"agent": "refund", "input": {"t": "\\ud800"}}', "lone surrogates"),
        ('{"agent": "refund", "input": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper"),
        ('{"agent": 7}', "'agent' must be a string"),
        ('{"input": {}}', "'agent' is required"),
        ('{"agent": "refund", "extra": 1}', "'extra' is not a known field"),
        ("[1, 2]", "JSON object"),
        ("{", "malformed JSON"),
    ],
)
def test_hostile_json_is_a_400_naming_the_problem(api, raw, fragment):
    assert fragment in assert_json_error(api.post("/api/runs", raw=raw), 400)["error"]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_size_and_content_type(api, settings):
    settings.AGENTRUNS_API_MAX_BODY_BYTES = 2048
    big = '{"agent": "refund", "input": {"t": "' + "x" * 4000 + '"}}'
    assert "larger than" in assert_json_error(api.post("/api/runs", raw=big), 413)["error"]
    response = api.client.post(
        "/api/runs",
        "agent=refund",
        content_type="application/x-www-form-urlencoded",
        HTTP_AUTHORIZATION=f"Bearer {api.token}",
    )
    assert "application/json" in assert_json_error(response, 415)["error"]


@pytest.mark.django_db
def test_session_writes_need_a_bearer_token(client, lead):
    client.force_login(lead)
    assert assert_json_error(
        client.post(f"/api/runs/{uuid.uuid4()}/cancel", {}, content_type="application/json"), 401
    )["error"]


@pytest.mark.django_db
def test_openapi_lists_every_route(api):
    from agentruns.api.endpoint import ENDPOINTS

    document = api.get("/api/openapi.json").json()
    assert document["openapi"].startswith("3.")
    declared = {("/api" + e.path, e.method.lower()) for e in ENDPOINTS}
    listed = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert declared == listed and ("/api/runs", "post") in listed
