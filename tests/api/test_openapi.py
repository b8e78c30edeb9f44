"""/api/openapi.json describes the API as it is: every route has its operation, and real answers
of every operation validate against the response schema the description gives them."""

from __future__ import annotations

import re

import jsonschema
from django.urls import URLResolver, get_resolver

from agentruns.api.endpoint import ENDPOINTS
from agentruns.api.openapi import openapi_document
from agentruns.models import Run
from agentruns.services import start_run
from tests.conftest import ApiClient
from tests.helpers import advance


def response_schema(document: dict, path: str, method: str, status: int) -> dict:
    operation = document["paths"][path][method]
    return operation["responses"][str(status)]["content"]["application/json"]["schema"]


def check(document: dict, path: str, method: str, response) -> None:
    schema = response_schema(document, path, method, response.status_code)
    jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)


def test_the_served_description_is_the_declarations(api):
    served = api.get("/api/openapi.json").json()
    assert served == openapi_document()
    assert served["openapi"].startswith("3.1")
    jsonschema.Draft202012Validator.check_schema({"$defs": {}})  # the dialect is 2020-12
    declared = {("/api" + e.path, e.method.lower()) for e in ENDPOINTS}
    described = {(p, m) for p, ops in served["paths"].items() for m in ops}
    assert declared == described
    for _, ops in served["paths"].items():
        for operation in ops.values():
            assert operation["summary"] and operation["responses"]
            for status, answer in operation["responses"].items():
                if status == "204":
                    assert "content" not in answer, operation["operationId"]
                    continue
                if "text/event-stream" in answer["content"]:  # the AI SDK chat's streams
                    assert status == "200", operation["operationId"]
                    continue
                schema = answer["content"]["application/json"]["schema"]
                if status.startswith("2"):
                    assert schema.get("properties"), (operation["operationId"], status)
                jsonschema.Draft202012Validator.check_schema(schema)


def api_resolver(resolver: URLResolver) -> URLResolver | None:
    """The `api/` include, wherever the project's URLconf nests it (`agentruns.urls` at the root)."""
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern) == "api/":
                return pattern
            if found := api_resolver(pattern):
                return found
    return None


def test_every_api_route_is_described(api):
    """Every route the URLconf really serves, with every method it answers (the `Allow` of its
    405 to OPTIONS), has its operation in the served description, and nothing more is described."""
    api_routes = api_resolver(get_resolver())
    served = set()
    for pattern in api_routes.url_patterns:
        route = str(pattern.pattern)
        if route == "openapi.json" or route.startswith("^"):  # the description, the JSON 404
            continue
        refused = api.client.options("/api/" + re.sub(r"<\w+:\w+>", "0", route))
        assert refused.status_code == 405, route
        path = "/api/" + re.sub(r"<\w+:(\w+)>", r"{\1}", route)
        served |= {(path, method.strip().lower()) for method in refused["Allow"].split(",")}
    document = api.get("/api/openapi.json").json()
    assert served == {(p, m) for p, ops in document["paths"].items() for m in ops}


def test_real_answers_match_their_schemas(seeded, settings, django_user_model):
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    api = ApiClient(django_user_model.objects.get(username="lead"))  # seed_demo's
    document = openapi_document()
    body = {"agent": "refund", "input": {"order_id": "ORD-1001", "message": "refund $15"}}
    created = api.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="doc-1")
    assert created.status_code == 201
    check(document, "/api/runs", "post", created)
    check(document, "/api/runs", "post", api.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="doc-1"))
    run_id = created.json()["id"]
    run = advance(Run.objects.get(id=run_id))  # parks for approval
    assert run.status == "waiting"
    check(document, "/api/runs/{run_id}", "get", api.get(f"/api/runs/{run_id}"))
    check(
        document, "/api/runs/{run_id}/events", "get", api.get(f"/api/runs/{run_id}/events?after=0")
    )
    listed = api.get("/api/approvals?status=pending")
    check(document, "/api/approvals", "get", listed)
    approval_id = listed.json()["approvals"][0]["id"]
    decided = api.post(f"/api/approvals/{approval_id}", {"decision": "approve"})
    check(document, "/api/approvals/{approval_id}", "post", decided)
    again = api.post(f"/api/approvals/{approval_id}", {"decision": "approve"})
    assert again.status_code == 409
    check(document, "/api/approvals/{approval_id}", "post", again)
    advance(run)
    forked = api.post(f"/api/runs/{run_id}/fork", {"from_step": 0})
    check(document, "/api/runs/{run_id}/fork", "post", forked)
    other = start_run("refund", {"order_id": "ORD-1002"}).run
    cancelled = api.post(f"/api/runs/{other.id}/cancel", {"reason": "duplicate"})
    check(document, "/api/runs/{run_id}/cancel", "post", cancelled)
    refused = api.post(f"/api/runs/{other.id}/retry")
    assert refused.status_code == 409
    check(document, "/api/runs/{run_id}/retry", "post", refused)
    for bad in (api.get("/api/runs/not-a-uuid"), api.post("/api/runs", raw="[1")):
        assert bad.status_code in (400, 404)
    check(document, "/api/runs/{run_id}", "get", api.get("/api/runs/not-a-uuid"))
