"""Plant secrets in a tool's arguments, its error and its traceback (and its log line), run it
on a real worker, then grep everything a person or a log can see: the run page, the runs list,
the API, the events, the socket frames, the admin and both processes' logs."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentruns.models import Run, RunEvent, Step, StepAttempt
from agentruns.services import start_run
from agentruns.stream.frames import encoded_frames_after
from agentruns.tokens import create_token
from tests.procs import start_web, start_worker, wait_until
from tests.web import leaky  # noqa: F401  (registers the agent in this process too)
from tests.web.leaky import PATTERN_SECRET, VALUE_SECRET

SECRETS = (PATTERN_SECRET, VALUE_SECRET)


def assert_clean(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} leaked into {where}"


@pytest.mark.django_db(transaction=True)
def test_no_secret_reaches_pages_events_admin_or_logs(tmp_path, lead):
    env = {"AGENTRUNS_AGENT_MODULES": "tests.web.leaky", "LOG_LEVEL": "INFO"}
    web, url = start_web(tmp_path, **env)
    worker = start_worker(tmp_path, **env)
    try:
        run = start_run("leaky", {}, user=lead).run
        wait_until(
            lambda: Run.objects.get(id=run.id).is_terminal, timeout=60, message="the run to end"
        )
        run.refresh_from_db()
        step = Step.objects.get(run=run, kind="tool")
        attempt = StepAttempt.objects.get(step=step)
        # the tool really failed with the secrets in its error and traceback, and logged them
        assert run.status == "failed" and step.status == "failed"
        assert "vendor refused" in step.error and "_vendor_call" in attempt.traceback
        assert "vendor call failed" in worker.log()
        assert step.arguments["api_key"] == PATTERN_SECRET  # the tool itself got its arguments

        # what people read, as stored
        assert_clean("run.error", run.error)
        assert_clean("step.error", step.error)
        assert_clean("attempt.error", attempt.error)
        assert_clean("attempt.traceback", attempt.traceback)
        events = json.dumps(list(RunEvent.objects.filter(run=run).values("type", "data")))
        assert_clean("events", events)
        assert_clean("frames", json.dumps(encoded_frames_after(run.id, 0, 1000)))

        # pages, admin and API as the superuser sees them
        client = Client()
        client.force_login(lead)
        model_step = Step.objects.get(run=run, kind="model", index=0)
        pages = [
            f"/runs/{run.id}/",
            "/runs/?status=failed",
            "/approvals/",
            f"/admin/agentruns/run/{run.id}/change/",
            f"/admin/agentruns/step/{step.id}/change/",
            f"/admin/agentruns/step/{model_step.id}/change/",
            "/admin/agentruns/stepattempt/",
            f"/admin/agentruns/stepattempt/{attempt.id}/change/",
            "/admin/agentruns/runevent/",
            *[
                f"/admin/agentruns/runevent/{pk}/change/"
                for pk in RunEvent.objects.filter(run=run).values_list("pk", flat=True)
            ],
        ]
        for page in pages:
            response = client.get(page)
            assert response.status_code == 200, page
            assert_clean(page, response.content.decode())
        auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(lead)}"}
        for path in (f"/api/runs/{run.id}", f"/api/runs/{run.id}/events"):
            response = Client().get(path, **auth)
            assert response.status_code == 200
            assert_clean(path, response.content.decode())
        # the live server's run page too (its own process and rendering)
        worker_log, web_log = worker.log(), web.log()
    finally:
        worker.kill()
        web.kill()
    assert_clean("the worker's log", (tmp_path / "worker.log").read_text(errors="replace"))
    assert_clean("the web server's log", web_log + worker_log)
