"""Who may stop a run, from the API, the chat and the run page: its starter their own, an
operator any, anyone else a 403; every bad input a JSON 4xx. (What a stop does to a model turn in
flight: tests/runtime/test_stop.py and tests/stream/test_stop_live.py.)"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentruns.api.chat import chat_dedupe_key
from agentruns.models import Run, RunEvent, RunStatus
from agentruns.services import start_run
from tests.helpers import ApiClient, assert_json_error, make_user

pytestmark = pytest.mark.django_db

STARTER_PERMS = ["agentruns.view_run", "agentruns.start_run"]


@pytest.fixture
def starter(django_user_model):
    return make_user(django_user_model, "starter", STARTER_PERMS)


@pytest.fixture
def colleague(django_user_model):
    """May look at and start runs like the starter, but this run is not theirs."""
    return make_user(django_user_model, "colleague", STARTER_PERMS)


def started_by(user, *, dedupe_key: str | None = None) -> Run:
    return start_run("script", {"script": [{"text": "x"}]}, user=user, dedupe_key=dedupe_key).run


def held_by_a_worker(run: Run) -> Run:
    """As a worker executes it: running, its lease live."""
    Run.objects.filter(id=run.id).update(
        status=RunStatus.RUNNING,
        lease_owner="w:1:a",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
    )
    return Run.objects.get(id=run.id)


def test_the_starter_may_stop_their_own_run_and_nobody_else_but_an_operator(
    starter, colleague, viewer, operator
):
    mine, theirs = started_by(starter), started_by(starter)
    for outsider in (colleague, viewer):
        body = assert_json_error(ApiClient(outsider).post(f"/api/runs/{mine.id}/stop"), 403)
        assert "starter or an operator" in body["error"]
    mine.refresh_from_db()
    assert mine.status == RunStatus.QUEUED and not mine.cancel_requested

    response = ApiClient(starter).post(f"/api/runs/{mine.id}/stop", {"reason": "wrong order"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    mine.refresh_from_db()
    assert (mine.status, mine.stop_reason) == ("cancelled", "stopped")
    requested = RunEvent.objects.get(run=mine, type="run.cancel_requested")
    assert requested.data["stop"] is True and requested.data["by"] == "starter"
    assert requested.data["reason"] == "wrong order"
    # ended: a second stop is a conflict, not a 500
    assert_json_error(ApiClient(starter).post(f"/api/runs/{mine.id}/stop"), 409)

    # an operator stops a run that is not theirs
    response = ApiClient(operator).post(f"/api/runs/{theirs.id}/stop")
    assert response.status_code == 200 and response.json()["stop_reason"] == "stopped"


def test_a_run_a_worker_holds_is_flagged_and_a_second_stop_is_no_error(starter):
    run = held_by_a_worker(started_by(starter))
    api = ApiClient(starter)
    first = api.post(f"/api/runs/{run.id}/stop")
    assert first.status_code == 200 and first.json()["cancel_requested"] is True
    assert first.json()["status"] == "running"  # the worker ends it (within a second)
    again = api.post(f"/api/runs/{run.id}/stop")  # a double click
    assert again.status_code == 200
    assert RunEvent.objects.filter(run=run, type="run.cancel_requested").count() == 1


def test_bad_input_is_a_json_4xx(starter):
    run = started_by(starter)
    api = ApiClient(starter)
    assert_json_error(api.post(f"/api/runs/{uuid.uuid4()}/stop"), 404)
    assert_json_error(api.post("/api/runs/not-a-run/stop"), 404)
    assert_json_error(api.post(f"/api/runs/{run.id}/stop", {"reason": 7}), 400)
    assert_json_error(api.post(f"/api/runs/{run.id}/stop", {"why": "x"}), 400)
    assert_json_error(api.post(f"/api/runs/{run.id}/stop", raw="{not json"), 400)
    assert_json_error(api.get(f"/api/runs/{run.id}/stop"), 405)
    assert_json_error(Client().post(f"/api/runs/{run.id}/stop"), 401)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED  # none of them stopped it


def test_the_chats_stop_button_stops_the_chats_run(starter, colleague):
    run = started_by(starter, dedupe_key=chat_dedupe_key("chat-1", starter))
    # another user's chat of the same id is not this one
    assert_json_error(ApiClient(colleague).post("/api/chat/script/chat-1/stop"), 404)
    assert_json_error(ApiClient(starter).post("/api/chat/script/chat-2/stop"), 404)
    assert_json_error(ApiClient(starter).post("/api/chat/script/bad%20id/stop"), 404)
    response = ApiClient(starter).post("/api/chat/script/chat-1/stop")
    assert response.status_code == 200 and response.json()["id"] == str(run.id)
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "stopped")


def test_the_run_pages_stop_is_the_starters_and_the_operators(starter, colleague, operator):
    run = started_by(starter)
    page = Client()
    page.force_login(starter)
    assert 'class="act-stop"' in page.get(f"/runs/{run.id}/").content.decode()
    other = Client()
    other.force_login(colleague)
    assert 'class="act-stop"' not in other.get(f"/runs/{run.id}/").content.decode()
    assert other.post(f"/runs/{run.id}/stop/").status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED

    response = page.post(f"/runs/{run.id}/stop/")
    assert response.status_code == 302
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "stopped")

    theirs = started_by(starter)
    desk = Client()
    desk.force_login(operator)
    assert desk.post(f"/runs/{theirs.id}/stop/").status_code == 302
    theirs.refresh_from_db()
    assert theirs.stop_reason == "stopped"


def test_stops_are_bounded_per_user_refused_ones_counted(starter, colleague, client, settings):
    """Refused stops (403: not theirs) took no quota before: each ask now takes one of the
    caller's stops, by every door; past them, 429 with Retry-After, and the starter's own stops
    are their own bucket."""
    settings.AGENTRUNS_ACTION_BURST, settings.AGENTRUNS_ACTION_PER_SECOND = 3, 0.001
    mine = started_by(starter)
    api = ApiClient(colleague)
    answers = [api.post(f"/api/runs/{mine.id}/stop") for _ in range(2)]
    client.force_login(colleague)
    assert client.post(f"/runs/{mine.id}/stop/").status_code == 403  # the page's door counts
    answers += [api.post(f"/api/runs/{mine.id}/stop") for _ in range(2)]
    assert [a.status_code for a in answers] == [403, 403, 429, 429]
    assert "too many stops" in answers[-1].json()["error"]
    assert int(answers[-1]["Retry-After"]) >= 1
    assert client.post(f"/runs/{mine.id}/stop/").status_code == 429
    assert Run.objects.get(id=mine.id).status == RunStatus.QUEUED
    assert ApiClient(starter).post(f"/api/runs/{mine.id}/stop").status_code == 200
