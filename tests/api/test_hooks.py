"""`POST /api/hooks/<token>` (runtime/waits/hooks.py): a bearer token with
`agentruns.resolve_hook` or a Standard Webhooks signature resumes the run waiting on the token,
exactly once (200, then 409 with the first resolution's time); nobody waiting: 404; a bad or
stale signature 401, signed hooks without a secret 403, no permission 403; bad bodies are JSON
4xx and resolve nothing; a burst of guesses meets 429, per sender and per process (issue 46)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from agentruns.models import Run, RunStatus, Wait, WaitStatus
from agentruns.runtime.values.webhook_signatures import new_secret, signed_headers
from tests.helpers import ApiClient, advance, assert_json_error, make_user
from tests.pydantic_ai.kit import start
from tests.runtime import wait_agents  # noqa: F401  (registers the agent that waits)

pytestmark = pytest.mark.django_db
SECRET = new_secret()


def _waiting(order_id: str) -> Run:
    run = advance(start("pa-waits", ("await_delivery", {"order_id": order_id})))
    assert run.status == RunStatus.WAITING, run.error
    return run


@pytest.fixture
def carrier(django_user_model) -> ApiClient:
    return ApiClient(make_user(django_user_model, "carrier", ["agentruns.resolve_hook"]))


def _signed_post(
    client: Client, token: str, body: str, secret: str = SECRET, msg: str = "msg_1", **at
):
    headers = signed_headers(secret, msg, body, **at)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return client.post(f"/api/hooks/{token}", body, content_type="application/json", **extra)


def test_a_hook_resolves_once_then_409_with_the_first_time(carrier):
    run = _waiting("H-1")
    first = carrier.post("/api/hooks/carrier:H-1", {"status": "delivered"})
    assert first.status_code == 200, first.content
    assert first.json()["run_id"] == str(run.id)
    again = carrier.post("/api/hooks/carrier:H-1", {"status": "delivered"})
    body = assert_json_error(again, 409)
    assert body["resolved_at"] == first.json()["resolved_at"]
    assert body["run_id"] == str(run.id) and body["resolved_by"] == "carrier"
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    tool = run.steps.get(kind="tool")
    assert tool.result == {"event": {"status": "delivered"}}


def test_nobody_waiting_is_404(carrier):
    assert_json_error(carrier.post("/api/hooks/carrier:nobody", {}), 404)


def test_a_second_runs_wait_on_a_held_token_fails_at_once_and_the_hook_reaches_the_holder(
    carrier,
):
    holder = _waiting("H-2")
    second = advance(start("pa-waits", ("await_delivery", {"order_id": "H-2"})))
    assert second.status == RunStatus.SUCCEEDED
    assert second.steps.get(kind="tool").result == {"held_by": str(holder.id)}
    answer = carrier.post("/api/hooks/carrier:H-2", {"ok": True})
    assert answer.status_code == 200 and answer.json()["run_id"] == str(holder.id)


def test_permission_missing_is_403_and_no_auth_401(django_user_model, client):
    run = _waiting("H-3")
    nobody = ApiClient(make_user(django_user_model, "nobody"))
    assert_json_error(nobody.post("/api/hooks/carrier:H-3", {}), 403)
    assert_json_error(client.post("/api/hooks/carrier:H-3", "{}", "application/json"), 401)
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING


def test_a_standard_webhooks_signature_resolves(client, settings):
    settings.AGENTRUNS_HOOK_SECRET = SECRET
    run = _waiting("H-4")
    response = _signed_post(client, "carrier:H-4", json.dumps({"status": "delivered"}))
    assert response.status_code == 200, response.content
    assert response.json()["run_id"] == str(run.id)
    assert Wait.objects.get(run=run).resolved_by == "webhook msg_1"


def test_a_signed_request_is_taken_once_whatever_token_it_is_sent_to(client, settings):
    settings.AGENTRUNS_HOOK_SECRET = SECRET
    lost, other = _waiting("H-7"), _waiting("H-8")
    body = json.dumps({"status": "lost"})
    first = _signed_post(client, "carrier:H-7", body, msg="msg_7")
    assert first.status_code == 200
    # the sender's retry (same id, same token) is told its delivery was taken, and by what run
    retried = assert_json_error(_signed_post(client, "carrier:H-7", body, msg="msg_7"), 409)
    assert (
        retried["run_id"] == str(lost.id) and retried["resolved_at"] == first.json()["resolved_at"]
    )
    # the same signed request (a valid signature: it covers the id, not the URL) to another
    # order's token within its five minutes: a replay, refused, nothing resolved
    replayed = assert_json_error(_signed_post(client, "carrier:H-8", body, msg="msg_7"), 409)
    assert "received already" in replayed["error"]
    assert Wait.objects.get(run=other).status == WaitStatus.PENDING
    assert Wait.objects.get(run=lost).resolved_by == "webhook msg_7"
    # a request that resolved nothing left no receipt: its retry (same id) may resolve
    assert _signed_post(client, "carrier:nobody", body, msg="msg_9").status_code == 404
    assert _signed_post(client, "carrier:H-8", body, msg="msg_9").status_code == 200
    assert Wait.objects.get(run=other).resolved_by == "webhook msg_9"


def test_bad_or_stale_signatures_are_401_and_signed_hooks_without_a_secret_403(client, settings):
    run = _waiting("H-5")
    body = json.dumps({"status": "delivered"})
    assert_json_error(_signed_post(client, "carrier:H-5", body), 403)  # no secret set
    settings.AGENTRUNS_HOOK_SECRET = SECRET
    assert_json_error(_signed_post(client, "carrier:H-5", body, secret=new_secret()), 401)
    stale = datetime.now(UTC) - timedelta(minutes=10)
    assert_json_error(_signed_post(client, "carrier:H-5", body, at=stale), 401)
    tampered = signed_headers(SECRET, "msg_2", body)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in tampered.items()}
    response = client.post(
        "/api/hooks/carrier:H-5", body.replace("delivered", "lost"), "application/json", **extra
    )
    assert_json_error(response, 401)
    garbled = {**extra, "HTTP_WEBHOOK_SIGNATURE": "v1"}
    assert_json_error(
        client.post("/api/hooks/carrier:H-5", body, "application/json", **garbled), 401
    )
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING


def test_bad_bodies_are_json_4xx_and_resolve_nothing(carrier, settings):
    run = _waiting("H-6")
    assert_json_error(carrier.post("/api/hooks/carrier:H-6", raw="{not json"), 400)
    assert_json_error(carrier.post("/api/hooks/carrier:H-6", raw='{"a": "\\u0000"}'), 400)
    assert_json_error(carrier.post("/api/hooks/carrier:H-6", raw="[1, 2]"), 400)
    settings.AGENTRUNS_API_MAX_BODY_BYTES = 1024
    assert_json_error(carrier.post("/api/hooks/carrier:H-6", {"x": "y" * 2000}), 413)
    response = carrier.client.post(
        "/api/hooks/carrier:H-6",
        "a=b",
        content_type="text/plain",
        HTTP_AUTHORIZATION=f"Bearer {carrier.token}",
    )
    assert_json_error(response, 415)
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING


def test_a_burst_of_guessed_tokens_meets_429_per_sender_refused_ones_counted(
    carrier, django_user_model, settings
):
    """The audit's 150 guesses got 150 x 404: every request, found or not, takes a token of its
    sender's bucket; past it, 429 with Retry-After, and a right token waits like the rest. Other
    senders keep their own bucket."""
    settings.AGENTRUNS_HOOK_BURST, settings.AGENTRUNS_HOOK_PER_SECOND = 5, 0.001
    run = _waiting("H-9")
    answers = [carrier.post(f"/api/hooks/guess-{n}", {}) for n in range(8)]
    assert [a.status_code for a in answers] == [404] * 5 + [429] * 3
    for refused in answers[5:]:
        assert int(refused["Retry-After"]) >= 1
        assert "too many hook resolutions" in refused.json()["error"]
    assert carrier.post("/api/hooks/carrier:H-9", {}).status_code == 429
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING
    other = ApiClient(make_user(django_user_model, "other-bot", ["agentruns.resolve_hook"]))
    assert other.post("/api/hooks/carrier:H-9", {}).status_code == 200


def test_every_sender_shares_the_processs_bound_signed_ones_too(
    carrier, django_user_model, client, settings
):
    """The signed sender has no user: its requests count before their signature is checked,
    against its own bucket and this process's, which bounds every sender together."""
    settings.AGENTRUNS_HOOK_SECRET = SECRET
    settings.AGENTRUNS_HOOK_PROCESS_BURST, settings.AGENTRUNS_HOOK_PROCESS_PER_SECOND = 4, 0.001
    other = ApiClient(make_user(django_user_model, "other-bot", ["agentruns.resolve_hook"]))
    assert carrier.post("/api/hooks/g-1", {}).status_code == 404
    assert other.post("/api/hooks/g-2", {}).status_code == 404
    body = json.dumps({})
    assert _signed_post(client, "g-3", body, secret=new_secret()).status_code == 401  # counted
    assert _signed_post(client, "g-4", body, msg="msg_g").status_code == 404
    refused = [
        carrier.post("/api/hooks/g-5", {}),
        other.post("/api/hooks/g-6", {}),
        _signed_post(client, "g-7", body, msg="msg_h"),
    ]
    for answer in refused:
        assert answer.status_code == 429, answer.content
        assert "this server takes no more hook resolutions" in answer.json()["error"]
        assert int(answer["Retry-After"]) >= 1
