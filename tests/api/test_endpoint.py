"""The API's one parsing path: every refusal is a JSON 4xx, and the routes match the declarations."""

from __future__ import annotations

import uuid

import pytest

from agentruns.models import Run
from tests.conftest import ApiClient


@pytest.fixture
def api_lead(lead):
    return ApiClient(lead)


def _error(response, status: int) -> str:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    return response.json()["error"]


@pytest.mark.django_db
def test_unknown_api_paths_and_methods_are_json(api_lead):
    assert "no API route" in _error(api_lead.get("/api/nope"), 404)
    assert "no API route" in _error(api_lead.get("/api/runs/x/y/z/w"), 404)
    response = api_lead.client.delete("/api/runs", HTTP_AUTHORIZATION=f"Bearer {api_lead.token}")
    assert "not allowed" in _error(response, 405) and response["Allow"] == "POST"


@pytest.mark.django_db
def test_a_malformed_id_is_a_json_404_before_any_query(api_lead, django_assert_max_num_queries):
    with django_assert_max_num_queries(3):  # the token lookup and its last-used stamp only
        assert _error(api_lead.get("/api/runs/not-a-uuid"), 404) == "no such run"
    assert (
        _error(api_lead.post("/api/approvals/١٢", {"decision": "approve"}), 404)
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
def test_hostile_json_is_a_400_naming_the_problem(api_lead, raw, fragment):
    assert fragment in _error(api_lead.post("/api/runs", raw=raw), 400)
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_size_and_content_type(api_lead, settings):
    settings.AGENTRUNS_API_MAX_BODY_BYTES = 2048
    big = '{"agent": "refund", "input": {"t": "' + "x" * 4000 + '"}}'
    assert "larger than" in _error(api_lead.post("/api/runs", raw=big), 413)
    response = api_lead.client.post(
        "/api/runs",
        "agent=refund",
        content_type="application/x-www-form-urlencoded",
        HTTP_AUTHORIZATION=f"Bearer {api_lead.token}",
    )
    assert "application/json" in _error(response, 415)


@pytest.mark.django_db
def test_session_writes_need_a_bearer_token(client, lead):
    client.force_login(lead)
    assert _error(
        client.post(f"/api/runs/{uuid.uuid4()}/cancel", {}, content_type="application/json"), 401
    )


@pytest.mark.django_db
def test_openapi_lists_every_route(client):
    from agentruns.api.endpoint import ENDPOINTS

    document = client.get("/api/openapi.json").json()
    assert document["openapi"].startswith("3.")
    declared = {("/api" + e.path, e.method.lower()) for e in ENDPOINTS}
    listed = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert declared == listed and ("/api/runs", "post") in listed
