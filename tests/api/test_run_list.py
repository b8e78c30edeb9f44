"""`GET /api/runs`: the runs page's filters and keyset pages as JSON (DESIGN.md 6)."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

import pytest
from django.utils import timezone

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from tests.helpers import ApiClient, assert_json_error, make_user

pytestmark = pytest.mark.django_db


def refund(order_id: str, user=None) -> Run:
    return start_run("refund", {"order_id": order_id, "message": "broken"}, user=user).run


def listed(api: ApiClient, query: str = "") -> dict:
    response = api.get(f"/api/runs{query}")
    assert response.status_code == 200, response.content
    return response.json()


def ids(page: dict) -> list[str]:
    return [r["id"] for r in page["runs"]]


def test_lists_newest_first_with_the_fields_of_the_runs_page(api, lead):
    first, second = refund("ORD-1001", lead), refund("ORD-1002")
    page = listed(api)
    assert ids(page) == [str(second.id), str(first.id)]
    assert page["next"] is None and page["newer"] is None
    row = page["runs"][1]
    assert row["agent"] == "refund" and row["status"] == RunStatus.QUEUED
    assert row["created_by"] == "lead" and row["trace_id"] == first.trace_id
    assert len(first.trace_id) == 32


def test_filters(api, lead, django_user_model):
    other = make_user(django_user_model, "other", ["agentruns.start_run"])
    mine, theirs, third = refund("ORD-1001", lead), refund("ORD-1002", other), refund("ORD-1003")
    Run.objects.filter(id=third.id).update(status=RunStatus.FAILED)
    assert ids(listed(api, "?status=failed")) == [str(third.id)]
    assert ids(listed(api, "?created_by=other")) == [str(theirs.id)]
    assert ids(listed(api, "?q=ORD-1001")) == [str(mine.id)]
    assert ids(listed(api, "?agent=nobody")) == []
    assert len(ids(listed(api, "?agent=refund"))) == 3
    # a creation window (ISO 8601, with or without a zone: UTC)
    Run.objects.filter(id=mine.id).update(created_at=timezone.now() - timedelta(days=2))
    yesterday = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert ids(listed(api, f"?created_before={yesterday}")) == [str(mine.id)]
    assert set(ids(listed(api, f"?created_after={yesterday}Z"))) == {str(theirs.id), str(third.id)}


def test_keyset_pages_walk_every_run_once_both_ways(api):
    runs = [refund(f"ORD-10{n:02d}") for n in range(1, 8)]
    expected = [str(r.id) for r in reversed(runs)]
    seen, query, pages = [], "?limit=3", []
    while True:
        page = listed(api, query)
        pages.append(page)
        seen += ids(page)
        if page["next"] is None:
            break
        query = f"?limit=3&older={page['next']}"
    assert seen == expected and len(pages) == 3
    back = listed(api, f"?limit=3&newer={pages[2]['newer']}")
    assert ids(back) == ids(pages[1])


@pytest.mark.parametrize(
    "query",
    [
        "?status=exploded",
        "?limit=0",
        "?limit=201",
        "?limit=ten",
        "?created_after=yesterday",
        "?created_before=2026-13-45T00:00:00",
        "?older=123-not-a-cursor",
        "?older=123-" + "-" * 36,
        "?newer=12345678901234567890-00000000000000000000000000000000",
    ],
)
def test_bad_filters_are_json_400(api, query):
    assert_json_error(api.get(f"/api/runs{query}"), 400)


def test_offsets_postgresql_cannot_store_are_read_in_utc(api):
    """Python reads offsets up to 23:59, PostgreSQL's timestamptz only up to 15:59: schemathesis
    found `created_before=1200-08-14T05:14:40+16:29` answering 500. The moment is the same moment
    in UTC; one that has no UTC (year 1 before its offset) is a 400."""
    run = refund("ORD-1001")
    later = (timezone.now() + timedelta(hours=20)).strftime("%Y-%m-%dT%H:%M:%S+16:29")
    assert ids(listed(api, f"?created_before={quote(later)}")) == [str(run.id)]
    assert ids(listed(api, f"?created_after={quote(later)}")) == []
    assert_json_error(api.get(f"/api/runs?created_after={quote('0001-01-01T00:00:00+16:29')}"), 400)


def test_needs_view_run(django_user_model, client):
    assert_json_error(client.get("/api/runs"), 401)
    nobody = ApiClient(make_user(django_user_model, "nobody", []))
    assert_json_error(nobody.get("/api/runs"), 403)
    viewer = ApiClient(make_user(django_user_model, "looker", ["agentruns.view_run"]))
    assert viewer.get("/api/runs").status_code == 200


def test_a_traceparent_on_start_continues_the_callers_trace(api):
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = api.post(
        "/api/runs",
        {"agent": "refund", "input": {"order_id": "ORD-1001", "message": "broken"}},
        HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01",
    )
    assert response.status_code == 201
    run = Run.objects.get(id=response.json()["id"])
    assert run.trace_id == trace and run.trace_parent == f"00-{trace}-00f067aa0ba902b7-01"
    assert response.json()["trace_id"] == trace
    # an invalid one is ignored (W3C): a trace of its own, never a refusal
    for bad in ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", "garbage", "ff-" + trace + "-1-01"):
        response = api.post(
            "/api/runs",
            {"agent": "refund", "input": {"order_id": "ORD-1002", "message": "x"}},
            HTTP_TRACEPARENT=bad,
        )
        assert response.status_code == 201
        run = Run.objects.get(id=response.json()["id"])
        assert run.trace_id not in ("", trace) and run.trace_parent == ""
