"""Every answer under /api/ is JSON (DESIGN 6): any method, known or unknown path, with a bearer
token, a session without a CSRF token, or no credentials at all.

The clients enforce CSRF as a browser's requests meet it (Django's test client skips the check
unless asked): a POST to an unknown path once met the CSRF check before any view and got
Django's HTML "403 Forbidden" page."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from agentruns.tokens import create_token

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
RUN = str(uuid.uuid4())
KNOWN = (
    "/api/runs",
    f"/api/runs/{RUN}",
    f"/api/runs/{RUN}/cancel",
    "/api/approvals",
    "/api/approvals/bulk",
    "/api/chat/refund",
    "/api/openapi.json",
)
UNKNOWN = ("/api/nope", "/api/nope/", f"/api/runs/{RUN}/nope", "/api/approvals/1/x/y", "/api/")


@pytest.fixture
def callers(lead):
    token = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {create_token(lead)}")
    session = Client(enforce_csrf_checks=True)
    session.force_login(lead)
    return {"token": token, "session": session, "none": Client(enforce_csrf_checks=True)}


def _assert_json(response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), (
        what,
        response.status_code,
        response["Content-Type"],
        response.content[:300],
    )
    if response.status_code >= 400 and response.content:
        assert isinstance(response.json().get("error"), str), (what, response.content[:300])


@pytest.mark.django_db
@pytest.mark.parametrize("caller", ["token", "session", "none"])
def test_every_method_on_every_path_answers_json(callers, caller):
    client = callers[caller]
    for path in KNOWN + UNKNOWN:
        for method in METHODS:
            response = client.generic(method, path, b"{}", content_type="application/json")
            _assert_json(response, f"{caller} {method} {path}")
            if path in UNKNOWN:
                assert response.status_code == 404, (caller, method, path, response.content)


@pytest.mark.django_db
def test_a_csrf_failure_under_api_is_a_json_403(lead):
    """A session write without the CSRF token, to an endpoint that takes session writes."""
    session = Client(enforce_csrf_checks=True)
    session.force_login(lead)
    answer = session.post("/api/chat/refund", b"{}", content_type="application/json")
    assert answer.status_code == 403
    assert "CSRF" in answer.json()["error"]
    # pages keep Django's own CSRF page
    page = session.post("/runs/new/", {"agent": "refund"})
    assert page.status_code == 403 and page["Content-Type"].startswith("text/html")


@pytest.mark.django_db
def test_a_bad_host_under_api_is_a_json_400(lead):
    answer = Client().get("/api/runs", HTTP_HOST="not-allowed.example")
    assert answer.status_code == 400
    assert answer["Content-Type"].startswith("application/json")
    assert answer.json()["error"]
