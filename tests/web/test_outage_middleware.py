"""The outermost middleware (agentruns/web/outage.py) answers 503 for an outage met outside any
view too, where Django has already turned the error into a 500 (or, with DEBUG, its debug page)
before it comes back up the stack. The whole drill against a stopped
PostgreSQL is tests/web/test_database_outage.py."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.web.outage_middleware import DOWN_HEADER

pytestmark = pytest.mark.django_db

INNER = "tests.web.outage_middleware.DatabaseGoneOnTheWayOut"


@pytest.fixture
def stack(settings):
    # inside the session middleware, as a session save on the way out would be
    at = settings.MIDDLEWARE.index("django.contrib.sessions.middleware.SessionMiddleware")
    settings.MIDDLEWARE = [*settings.MIDDLEWARE[: at + 1], INNER, *settings.MIDDLEWARE[at + 1 :]]
    return Client(raise_request_exception=False)


@pytest.mark.parametrize("debug", [False, True])
def test_an_outage_outside_a_view_is_a_503_page_not_a_500(stack, settings, debug):
    settings.DEBUG = debug
    response = stack.get("/accounts/login/", headers={DOWN_HEADER: "1"})
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert int(response["Retry-After"]) > 0
    body = response.content.decode()
    assert "Back soon" in body and "database" in body
    assert "Traceback" not in body and "OperationalError" not in body


def test_an_outage_outside_a_view_under_api_is_json(stack):
    response = stack.get("/api/openapi.json", headers={DOWN_HEADER: "1"})
    assert response.status_code == 503
    assert response.json() == {
        "error": "the database is unavailable; try again in 5 seconds",
        "unavailable": "database",
    }
    assert int(response["Retry-After"]) > 0


def test_without_an_outage_the_same_stack_answers_normally(stack):
    assert stack.get("/accounts/login/").status_code == 200
