"""A model-provider outage is weather (runtime/outages/model_outage.py): the fake OpenAI-compatible server
is really stopped and started again on its port, and answers 503 and 429 with Retry-After.

With a real worker: the run backs off (queued, with the reason and the next try, on the run page
too), no provider error counts as a step attempt, and the run finishes with one refund once the
server is back. In process: an answer that will not change (404) fails at once with the reason;
an outage longer than AGENTRUNS_MODEL_OUTAGE_SECONDS fails the step with a stated reason, and
`POST /api/runs/<id>/retry` then finishes the run. A doorbell of the run rung before a 429 does
not bring it back to the provider before the 429's Retry-After.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agentruns.models import AttemptOutcome, Run, RunEvent, RunStatus, StepAttempt
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.services import start_run
from agentruns.tokens import create_token
from scripts.fake_openai_server import Fail, FakeOpenAI, Reply
from tests.helpers import advance, steps
from tests.procs import (
    free_port,
    gateway_refunds,
    start_run_over_http,
    start_web,
    start_worker,
    wait_until,
)
from tests.providers.kit import API_KEY, MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def latest_status(run_id) -> dict:
    return (
        RunEvent.objects.filter(run_id=run_id, type="run.status")
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )


def backing_off_for_the_model(run_id) -> dict | None:
    data = latest_status(run_id)
    if data and data["status"] == "queued" and "model unavailable" in data.get("reason", ""):
        return data
    return None


RUNS = 8  # in flight through one worker while the model server is away
ORDERS = [f"ORD-10{10 + i}" for i in range(RUNS)]


def order_of(request) -> str:
    """The order a model request is about (the customer's message names it)."""
    text = " ".join(str(m.get("content") or "") for m in request.messages)
    return next(order for order in ORDERS if order in text)


def test_runs_back_off_while_the_model_server_is_down_and_finish_when_it_returns(
    tmp_path: Path, seeded, client
):
    fake = FakeOpenAI(port=free_port(), mode="refund", api_key=API_KEY).start()
    port = fake.port
    fake.stop()  # down before the runs start: connection refused
    env = {
        "AGENTRUNS_MODEL": MODEL,
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_TIMEOUT_SECONDS": 10,
        "OPENAI_MAX_RETRIES": 0,  # every failure reaches the engine at once
        "AGENTRUNS_MODEL_BACKOFF_SECONDS": 0.5,
        "AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS": 2,
        "AGENTRUNS_RETRY_SLEEP_MAX_SECONDS": 0.2,  # any wait longer frees the thread: visible
        "AGENTRUNS_MODEL_OUTAGE_SECONDS": 300,
        "REFUND_APPROVAL_THRESHOLD_CENTS": 1_000_000_000,
    }
    web, url = start_web(tmp_path, **env)
    worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway", **env)
    revived: FakeOpenAI | None = None
    try:
        lead = User.objects.get(username="lead")
        token = create_token(lead)
        run_ids = [
            start_run_over_http(url, token, {"order_id": order, "message": "Broken, refund it."})
            for order in ORDERS
        ]
        for run_id in run_ids:
            backing_off = wait_until(
                lambda run_id=run_id: backing_off_for_the_model(run_id),
                timeout=60,
                message="every run backing off",
            )
            assert "unreachable" in backing_off["reason"] and backing_off["until"]
            assert backing_off["model_outage"]["step"] == 0
        # the run page says so: the reason and the next try (read while it is not mid-try)
        client.force_login(lead)
        page = wait_until(
            lambda: (
                (html := client.get(f"/runs/{run_ids[0]}/").content.decode()).count('id="backoff"')
                and html
            ),
            timeout=30,
            message="the run page to show the backoff",
        )
        shown = page[page.index('id="backoff"') :].split("</dd>")[0]
        assert "model unavailable" in shown and "unreachable" in shown and "next try at" in shown
        # still down a few tries later: no attempt was counted, nothing failed
        wait_until(
            lambda: (
                (backing_off_for_the_model(run_ids[-1]) or {})
                .get("model_outage", {})
                .get("failures", 0)
                >= 3
            ),
            timeout=60,
            message="three failed tries",
        )
        assert not StepAttempt.objects.filter(step__run_id__in=run_ids).exists()
        assert not Run.objects.filter(id__in=run_ids, status="failed").exists()

        # back, first with a 503, then a 429 that asks for 2 s, then answering
        revived = FakeOpenAI(port=port, mode="refund", api_key=API_KEY)
        revived.script(Fail(503), Fail(429, retry_after=2))
        revived.start()
        back_at = time.monotonic()
        wait_until(
            lambda: (
                Run.objects.filter(id__in=run_ids, status__in=("succeeded", "failed")).count()
                == RUNS
            ),
            timeout=180,
            message="every run to finish",
        )
        ledgers = {order: gateway_refunds(url, order) for order in ORDERS}
    finally:
        worker.stop()
        web.stop()
        if revived is not None:
            revived.stop()

    assert worker.popen.returncode == -9  # killed by the test, never exited on its own
    runs = list(Run.objects.filter(id__in=run_ids))
    assert [r.status for r in runs] == ["succeeded"] * RUNS, [r.error for r in runs]
    assert all(len(ledger) == 1 for ledger in ledgers.values()), ledgers  # one refund each
    requests = revived.chat_requests()
    # the request the 429 went to, as the server answered it: with runs asking at once, the
    # order requests arrive in is not the order they take the script in
    (on_429,) = [r for r in requests if r.status == 429]
    after_429 = next(
        r
        for r in requests
        if r.received_at > on_429.received_at and order_of(r) == order_of(on_429)
    )
    assert after_429.received_at - on_429.received_at >= 2.0  # Retry-After honoured
    # provider errors are weather: every model step has one attempt, and it succeeded
    for run in runs:
        for step in steps(run, kind="model"):
            assert step.attempts == 1, step
            outcomes = list(StepAttempt.objects.filter(step=step).values_list("outcome", flat=True))
            assert outcomes == [AttemptOutcome.SUCCEEDED]
    firsts = {}
    for request in requests:
        firsts.setdefault(order_of(request), request.received_at - back_at)
    print(
        f"\n[model-outage] {RUNS} runs backing off; after the server returned (answering 503, "
        f"then 429 with Retry-After: 2, then normally): first call {min(firsts.values()):.2f}s, "
        f"every run calling again within {max(firsts.values()):.2f}s"
    )


@pytest.fixture
def model_settings(settings):
    settings.AGENTRUNS_MODEL = MODEL
    settings.OPENAI_API_KEY = API_KEY
    settings.OPENAI_TIMEOUT_SECONDS = 5
    settings.OPENAI_MAX_RETRIES = 0
    settings.OPENAI_REQUEST_OPTIONS = ""
    settings.AGENTRUNS_MODEL_PRICES = ""
    settings.AGENTRUNS_MAX_COST_USD = 0
    settings.AGENTRUNS_MODEL_BACKOFF_SECONDS = 0.2
    settings.AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS = 0.5
    return settings


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (401, "Incorrect API key provided", "model error: authentication failed (HTTP 401)"),
        (404, "The model `fake-model` does not exist", "model error: model not found"),
        (400, "messages: unknown role 'robot'", "model error: invalid request (HTTP 400)"),
    ],
)
def test_an_answer_that_will_not_change_fails_at_once_with_its_reason(
    model_settings, status, message, reason
):
    with FakeOpenAI(mode="error") as fake:
        model_settings.OPENAI_BASE_URL = fake.url
        fake.script(Fail(status, message=message))
        run = advance(start_run("script", {"case": "openai"}).run)
        assert run.status == "failed"
        assert run.error.startswith(reason) and message in run.error
        assert len(fake.chat_requests()) == 1  # never retried
        backoffs = RunEvent.objects.filter(run=run, data__has_key="model_outage")
        assert not backoffs.exists()  # no backoff either


def test_an_outage_past_the_budget_fails_with_its_reason_and_retry_finishes(
    model_settings, client, seeded
):
    model_settings.AGENTRUNS_MODEL_OUTAGE_SECONDS = 2
    fake = FakeOpenAI(port=free_port(), mode="error").start()
    port = fake.port
    model_settings.OPENAI_BASE_URL = fake.url
    fake.stop()
    started = time.monotonic()
    run = advance(start_run("script", {"case": "openai"}).run)
    assert time.monotonic() - started >= 2.0
    assert run.status == "failed"
    assert run.error.startswith("model error: the model endpoint was unavailable for 2 s")
    assert "AGENTRUNS_MODEL_OUTAGE_SECONDS=2" in run.error and "unreachable" in run.error
    (step,) = steps(run)
    assert step.status == "failed" and step.attempts == 1  # the verdict's one attempt

    with FakeOpenAI(port=port, mode="error") as revived:
        revived.script(Reply(text="Here now."))
        token = create_token(User.objects.get(username="lead"))
        answer = client.post(
            f"/api/runs/{run.id}/retry",
            {},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert answer.status_code == 200, answer.content
        run = advance(run)
    assert run.status == "succeeded" and run.output == "Here now."
    (step,) = steps(run)
    assert step.status == "succeeded" and step.attempts == 2
    assert run.finished_at <= timezone.now()


def test_a_doorbell_rung_before_a_429_does_not_cut_its_retry_after_short(model_settings):
    """Doorbells are at-least-once: a run backing off can have one rung before its wait began
    (left in the queue when a claimer took the run first, before it failed again). Delivered
    while the run waits out a 429's Retry-After, it finds the run not due and leaves it alone:
    the provider hears from the run again only once the wait is over."""
    model_settings.AGENTRUNS_RETRY_SLEEP_MAX_SECONDS = 0.2  # a longer wait frees the thread
    drain = threading.Event()  # executed as a worker's pool executes: a back-off is queued
    with FakeOpenAI(mode="error") as fake:
        model_settings.OPENAI_BASE_URL = fake.url
        fake.script(Fail(429, retry_after=2), Reply(text="Here now."))
        run = start_run("script", {"case": "openai"}).run
        assert RunExecutor(run.id, drain=drain).advance() == RunStatus.QUEUED
        run.refresh_from_db()
        (on_429,) = fake.chat_requests()
        assert on_429.status == 429 and run.lease_owner == ""
        # the earlier doorbell, delivered during the wait
        assert RunExecutor(run.id, drain=drain).advance() == "busy"
        assert len(fake.chat_requests()) == 1 and latest_status(run.id)["status"] == "queued"
        # its own doorbell, when due
        time.sleep(max(0.0, (run.enqueued_at - timezone.now()).total_seconds()))
        assert RunExecutor(run.id, drain=drain).advance() == RunStatus.SUCCEEDED
        _, after_429 = fake.chat_requests()
    assert after_429.status == 200
    assert after_429.received_at - on_429.received_at >= 2.0  # Retry-After honoured
