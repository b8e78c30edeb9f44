"""The base layout (issue 34, item 6): navigation counts that follow by themselves on every page
(one cached query per process, each count only for who may see it), and the error pages (403,
404, 429, 503) in the layout, JSON under /api/."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from agentruns.web.layout import navigation
from tests.helpers import ApiClient, make_user

pytestmark = pytest.mark.django_db

NAV = "/runs/nav/"


@pytest.fixture(autouse=True)
def _fresh_counts():
    navigation.forget_counts()
    yield
    navigation.forget_counts()


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_every_page_polls_the_counts(viewer, seeded):
    page = signed_in(viewer).get("/runs/").content.decode()
    assert f'hx-get="{NAV}" hx-trigger="every 5s" hx-swap="none"' in page
    run = start_run("refund", {"order_id": "ORD-1001"}).run
    page = signed_in(viewer).get(f"/runs/{run.id}/").content.decode()  # the run page too
    assert f'hx-get="{NAV}"' in page


def test_the_poll_answers_every_count_out_of_band_from_one_cached_query(
    viewer, seeded, monkeypatch
):
    client = signed_in(viewer)
    client.get("/runs/")  # the session, the user: read once
    start_run("refund", {"order_id": "ORD-1001"})
    navigation.forget_counts()
    with CaptureQueriesContext(connection) as first:
        fragment = client.get(NAV).content.decode()
    assert (
        '<a id="nav-queued" href="/runs/?status=queued" hx-swap-oob="true">Queued <span class="count">1</span></a>'
        in fragment
    )
    assert '<span class="count" id="nav-pending" hx-swap-oob="true">0</span>' in fragment
    counts = [q["sql"] for q in first.captured_queries if "UNION ALL" in q["sql"]]
    assert len(counts) == 1  # every count in one statement
    start_run("refund", {"order_id": "ORD-1002"})
    with CaptureQueriesContext(connection) as again:
        assert 'Queued <span class="count">1</span>' in client.get(NAV).content.decode()
    assert not [q for q in again.captured_queries if "UNION ALL" in q["sql"]]  # cached
    monkeypatch.setattr(navigation, "NAV_COUNTS_TTL_SECONDS", 0)
    assert 'Queued <span class="count">2</span>' in client.get(NAV).content.decode()


def test_each_count_only_for_who_may_see_it(django_user_model, seeded):
    only_runs = make_user(django_user_model, "runs-only", ["agentruns.view_run"])
    fragment = signed_in(only_runs).get(NAV).content.decode()
    assert 'id="nav-failed"' in fragment and 'id="nav-pending"' not in fragment
    nobody = make_user(django_user_model, "nobody")
    assert 'id="nav-' not in signed_in(nobody).get(NAV).content.decode()
    assert Client().get(NAV).status_code == 302  # signed out: to the login page


def test_a_page_you_may_not_open_is_a_page_of_the_layout(viewer):
    response = signed_in(viewer).get("/runs/new/")
    assert response.status_code == 403
    page = response.content.decode()
    assert 'class="topbar"' in page and 'id="error-page" data-status="403"' in page
    assert "Your account may not do this" in page and "viewer" in page
    assert 'href="/runs/"' in page  # where to go instead
    # the API stays JSON
    api = ApiClient(viewer).post("/api/runs", {"agent": "script", "input": {}})
    assert api.status_code == 403 and "start_run" in api.json()["error"]


def test_a_missing_page_is_a_page_of_the_layout(viewer):
    response = signed_in(viewer).get("/runs/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'id="error-page" data-status="404"' in page and "There is nothing here" in page
    assert signed_in(viewer).get("/no/such/page/").status_code == 404
    api = signed_in(viewer).get("/api/runs/00000000-0000-0000-0000-000000000000")
    assert api.status_code == 404 and api.json()["error"]


def test_the_quota_and_outage_pages_share_the_layout(settings, django_user_model):
    from agentruns.web.outage import outage_response

    settings.AGENTRUNS_START_BURST, settings.AGENTRUNS_START_PER_SECOND = 1, 0.001
    client = signed_in(make_user(django_user_model, "starter", ["agentruns.start_run"]))
    form = {"agent": "script", "input": '{"script": []}'}
    assert client.post("/runs/new/", form).status_code == 302
    refused = client.post("/runs/new/", form)
    assert refused.status_code == 429
    assert 'id="error-page" data-status="429"' in refused.content.decode()
    assert Run.objects.filter(status=RunStatus.QUEUED).count() == 1

    class Request:
        path = "/runs/"

    outage = outage_response(Request(), "database").content.decode()
    assert 'class="topbar"' in outage and 'data-status="503"' in outage
    assert "Sign out" not in outage  # no user, no navigation: both read the database
