"""What a waiting run waits for (selectors/waiting.py): `waiting_for` in the run API and the
runs list (with its filter), on the run page and the runs page, and in /metrics by kind."""

from __future__ import annotations

import pytest

from agentruns.models import Wait
from agentruns.runtime.values.timestamps import iso
from tests.helpers import ApiClient, advance, make_user
from tests.pydantic_ai.kit import start
from tests.runtime import wait_agents  # noqa: F401  (registers the agent that waits)
from tests.web.test_health import families, samples

pytestmark = pytest.mark.django_db


@pytest.fixture
def lead(django_user_model):
    return make_user(django_user_model, "lead", superuser=True)


def _runs():
    event = advance(start("pa-waits", ("await_delivery", {"order_id": "W-1"})))
    timer = advance(start("pa-waits", ("wait_for", {"seconds": 7200})))
    done = advance(start("pa-waits", ("wait_until", {"when": "2020-01-01T00:00:00Z"})))
    assert (event.status, timer.status, done.status) == ("waiting", "waiting", "succeeded")
    return event, timer, done


def test_the_run_api_and_the_list_say_what_each_run_waits_for(lead):
    event, timer, done = _runs()
    api = ApiClient(lead)
    body = api.get(f"/api/runs/{event.id}").json()
    wait = Wait.objects.get(run=event)
    assert body["waiting_for"] == {
        "kind": "event",
        "since": iso(wait.created_at),
        "due": None,
        "token": "carrier:W-1",
    }
    timed = api.get(f"/api/runs/{timer.id}").json()["waiting_for"]
    assert timed["kind"] == "timer" and timed["due"] == iso(Wait.objects.get(run=timer).due_at)
    assert timed["token"] is None  # a timer's token is no hook's
    assert api.get(f"/api/runs/{done.id}").json()["waiting_for"] is None

    listed = {r["id"]: r["waiting_for"] for r in api.get("/api/runs").json()["runs"]}
    assert listed[str(event.id)]["kind"] == "event" and listed[str(done.id)] is None
    timers = api.get("/api/runs?waiting_for=timer").json()["runs"]
    assert [r["id"] for r in timers] == [str(timer.id)]
    assert api.get("/api/runs?waiting_for=question").json()["runs"] == []
    assert api.get("/api/runs?waiting_for=nonsense").status_code == 400


def test_the_pages_show_it_and_the_list_filters_on_it(client, lead):
    event, timer, _ = _runs()
    client.force_login(lead)
    page = client.get(f"/runs/{timer.id}/").content.decode()
    assert 'id="waiting-for"' in page and 'data-kind="timer"' in page and "wakes at" in page
    event_page = client.get(f"/runs/{event.id}/").content.decode()
    assert "<code>carrier:W-1</code>" in event_page
    listed = client.get("/runs/?waiting_for=event").content.decode()
    assert str(event.id) in listed and str(timer.id) not in listed
    assert "for event" in listed


def test_metrics_count_waiting_runs_by_kind_with_the_oldest(client, settings):
    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 0  # another test's scrape may be cached
    _runs()
    pending = Wait.objects.filter(kind="timer", status="pending")  # the done run's is resolved
    pending.update(created_at=pending.get().created_at.replace(year=2020))
    parsed = families(client)
    waiting = samples(parsed["agentruns_runs_waiting_for"])
    assert waiting[(("kind", "event"),)] == 1 and waiting[(("kind", "timer"),)] == 1
    assert waiting[(("kind", "question"),)] == 0
    oldest = samples(parsed["agentruns_runs_waiting_for_oldest_seconds"])
    assert oldest[(("kind", "timer"),)] > 86400 * 300
