"""/metrics behind a token, an allow-list or a staff login; /healthz's details for them alone
(a bare status, with the same code, for load balancers); /api/openapi.json needs the API's login.
(agentruns/operators.py)"""

from __future__ import annotations

import pytest
from django.test import Client

from tests.helpers import ApiClient, make_user

pytestmark = pytest.mark.django_db

STAFF_FREE = ["agentruns.view_run"]


def test_metrics_need_a_token_an_allowed_address_or_staff(
    settings, client, lead, django_user_model
):
    assert client.get("/metrics").status_code == 200  # the default allow-list: the loopback
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403
    settings.AGENTRUNS_METRICS_ALLOW = ""  # e.g. behind a proxy on the same machine
    settings.AGENTRUNS_METRICS_TOKEN = "scrape-secret-123"
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    viewer = Client()
    viewer.force_login(make_user(django_user_model, "viewer", STAFF_FREE))
    assert viewer.get("/metrics").status_code == 403  # signed in, but not staff
    scraper = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-123")
    assert scraper.status_code == 200 and b"agentruns_" in scraper.content
    staff = Client()
    staff.force_login(lead)
    assert staff.get("/metrics").status_code == 200
    settings.AGENTRUNS_METRICS_ALLOW = "10.0.0.0/8, 127.0.0.1"
    assert client.get("/metrics").status_code == 200  # the test client's 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


def test_healthz_details_are_for_operators_the_status_is_for_everyone(client, lead):
    bare = client.get("/healthz", REMOTE_ADDR="192.0.2.7")
    assert bare.status_code == 503  # no worker here: unhealthy, for everyone alike
    assert bare.json() == {"status": "unhealthy"}
    staff = Client()
    staff.force_login(lead)
    detailed = staff.get("/healthz", REMOTE_ADDR="192.0.2.7")
    assert detailed.status_code == 503
    assert set(detailed.json()["checks"]) == {"database", "worker", "sweeper"}


def test_the_openapi_description_needs_the_apis_login(client, lead):
    refused = client.get("/api/openapi.json")
    assert refused.status_code == 401 and "error" in refused.json()
    assert ApiClient(lead).get("/api/openapi.json").json()["openapi"].startswith("3.")
    session = Client()
    session.force_login(lead)
    assert session.get("/api/openapi.json").status_code == 200
