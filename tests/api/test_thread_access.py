"""Who may do what to a thread (issue 33): interrupting is stopping, a chat is its user's own,
posting is not reading, a message id or key is its sender's, and ids end where they end; the
thread `"thread": true` makes is nobody else's to predict or take first (issue 46).

In-process on the real PostgreSQL (`advance` runs a run's slices)."""

from __future__ import annotations

import uuid

import pytest

from agentruns.models import Run, RunStatus, Thread, ThreadKey, ThreadTurn
from tests import thread_agents  # noqa: F401  (registers pa-talk, pa-ask-customer)
from tests.api.test_threads import AGENT, post, run_of
from tests.helpers import ApiClient, advance, make_user

pytestmark = pytest.mark.django_db

ASK = "pa-ask-customer"
STAFF = ["agentruns.start_run", "agentruns.view_run"]


@pytest.fixture
def alice(django_user_model):
    return ApiClient(make_user(django_user_model, "alice", STAFF))


@pytest.fixture
def trainee(django_user_model):
    return ApiClient(make_user(django_user_model, "trainee", STAFF))


@pytest.fixture
def operator(django_user_model):
    return ApiClient(make_user(django_user_model, "op", [*STAFF, "agentruns.operate_run"]))


@pytest.fixture
def poster(django_user_model):
    """May start runs, may not read them (a customer-facing integration)."""
    return ApiClient(make_user(django_user_model, "poster", ["agentruns.start_run"]))


def chat_messages(*texts: str) -> list[dict]:
    return [
        {"id": f"u{i}", "role": "user", "parts": [{"type": "text", "text": t}]}
        for i, t in enumerate(texts, 1)
    ]


def test_an_interrupt_needs_the_right_to_stop_the_run(alice, trainee, operator):
    first = run_of(post(alice, "t-stop", "hello", agent=AGENT))
    refused = post(trainee, "t-stop", "mine now", multitask="interrupt")
    assert refused.status_code == 403, refused.content
    assert refused.json()["run_id"] == str(first.id)
    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED  # not stopped, and nothing stored for the post
    assert ThreadTurn.objects.filter(thread_id="t-stop").count() == 1
    queued = run_of(post(trainee, "t-stop", "after yours", multitask="enqueue"))
    assert queued.waiting_behind == first.id
    run_of(post(operator, "t-stop", "an operator may", multitask="interrupt"))
    assert Run.objects.get(id=first.id).status == RunStatus.CANCELLED


def test_the_run_page_form_follows_the_same_rule(alice, trainee):
    first = run_of(post(alice, "t-form", "hello", agent=AGENT))
    trainee.client.force_login(trainee.user)
    shown = trainee.client.get(f"/runs/{first.id}/").content.decode()
    assert 'name="multitask"' in shown and 'value="interrupt"' not in shown  # not offered
    alice.client.force_login(alice.user)
    assert 'value="interrupt"' in alice.client.get(f"/runs/{first.id}/").content.decode()
    page = trainee.client.post(
        f"/runs/{first.id}/thread/", {"text": "stop it", "multitask": "interrupt"}
    )
    assert page.status_code == 403
    assert Run.objects.get(id=first.id).status == RunStatus.QUEUED


def test_a_chat_takes_posts_from_its_user_or_an_operator_only(alice, trainee, operator):
    chat = alice.post(f"/api/chat/{AGENT}", {"id": "chat-a", "messages": chat_messages("hi")})
    assert chat.status_code == 200, chat.content[:300]
    refused = post(trainee, "chat-a", "mine now")
    assert refused.status_code == 403, refused.content
    assert Run.objects.filter(thread_id="chat-a").count() == 1
    run_of(post(alice, "chat-a", "its user may"))
    run_of(post(operator, "chat-a", "an operator may", **{"from": "staff"}))
    assert Run.objects.filter(thread_id="chat-a").count() == 3


def test_posting_is_not_reading(alice, poster):
    run_of(post(alice, "t-secret", "my card ends 4242", agent=AGENT))
    answer = post(poster, "t-secret", "hi")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["thread"] is None and "4242" not in answer.content.decode()
    assert body["message"]["text"] == "hi" and body["run"]["id"] == body["run_id"]  # its own


def test_a_message_id_or_key_is_its_senders(alice, poster, trainee):
    first = post(alice, "t-ids", "secret", agent=AGENT, id="m-1")
    assert first.status_code == 202
    again = post(poster, "t-ids", "x", id="m-1")
    assert again.status_code == 409, again.content
    # nor for someone who may view runs: another sender's id never stands in for yours
    viewing = post(trainee, "t-ids", "y", id="m-1")
    assert viewing.status_code == 409, viewing.content
    assert "use an id of your own" in viewing.json()["error"]
    started = alice.post(
        "/api/runs",
        {"agent": AGENT, "input": {"message": "secret"}, "thread": "t-key"},
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert started.status_code == 201
    other = poster.post(
        "/api/runs",
        {"agent": AGENT, "input": {"message": "x"}, "thread": "t-key"},
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert other.status_code == 409, other.content
    assert Run.objects.filter(thread_id__in=["t-ids", "t-key"]).count() == 2


def test_a_thread_of_ours_repeated_with_its_key_is_one_run(alice, trainee):
    body = {"agent": AGENT, "input": {"message": "hello"}, "thread": True}
    first = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="k-1")
    again = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["thread"] == first.json()["thread"]
    # another user's same key is their own thread
    theirs = trainee.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert theirs.status_code == 201 and theirs.json()["thread"] != first.json()["thread"]
    assert Run.objects.count() == 2 and Thread.objects.count() == 2


def legacy_thread_id(user, agent: str, key: str) -> str:
    """The id `"thread": true` used to derive for a user's key (the audit's prediction)."""
    namespace = uuid.UUID("6f1d5c52-3f0e-4f55-9d3c-2a7c4b8e9a10")  # it was in the source
    return str(uuid.uuid5(namespace, f"{user.pk}:{agent}:{key}"))


def test_a_thread_of_ours_cannot_be_predicted_or_taken_first(alice, trainee):
    """The audit's takeover: the trainee makes the thread the approver's `"thread": true` with
    Idempotency-Key K1 would have had, about another order, with the message id K1. The
    approver's start gets a thread and run of its own, not the trainee's, nor its history."""
    predicted = legacy_thread_id(alice.user, AGENT, "K1")
    taken = post(trainee, predicted, "refund ORD-1050 please", agent=AGENT, id="K1")
    assert taken.status_code == 202, taken.content
    body = {"agent": AGENT, "input": {"message": "refund ORD-1039"}, "thread": True}
    mine = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="K1")
    assert mine.status_code == 201, mine.content  # not the trainee's run (a 200)
    assert mine.json()["id"] != taken.json()["run_id"]
    thread_id = mine.json()["thread"]
    assert thread_id != predicted
    assert Thread.objects.get(id=thread_id).created_by == alice.user
    assert list(ThreadTurn.objects.filter(thread_id=thread_id).values_list("text", flat=True)) == [
        "refund ORD-1039"
    ]
    # a repeat of the key is the same thread and run; a new key a new, unrelated id
    again = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="K1")
    assert again.status_code == 200 and again.json()["id"] == mine.json()["id"]
    other = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="K2")
    assert other.status_code == 201 and other.json()["thread"] not in (thread_id, predicted)
    assert uuid.UUID(thread_id).version == 4  # random: nothing to derive it from
    assert ThreadTurn.objects.filter(thread_id=predicted).count() == 1  # the trainee's alone


def test_a_thread_of_ours_never_joins_another_users_thread(alice, trainee):
    """Whatever the key names, `"thread": true` posts only into a thread the caller made."""
    body = {"agent": AGENT, "input": {"message": "mine"}, "thread": True}
    theirs = trainee.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="k-shared").json()["thread"]
    ThreadKey.objects.create(user=alice.user, agent=AGENT, key="k-forged", thread_id=theirs)
    refused = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="k-forged")
    assert refused.status_code == 409, refused.content
    assert ThreadTurn.objects.filter(thread_id=theirs).count() == 1


def test_an_idempotency_key_names_only_its_starters_run(alice, trainee):
    """Another user's key never stands in for yours, even for a user who may view runs: the
    same key is their own run (as an API's keys are its client's)."""
    body = {"agent": AGENT, "input": {"message": "refund ORD-1050"}}
    theirs = trainee.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="ticket-T-1039")
    assert theirs.status_code == 201
    mine = alice.post(
        "/api/runs",
        {**body, "input": {"message": "refund ORD-1039"}},
        HTTP_IDEMPOTENCY_KEY="ticket-T-1039",
    )
    assert mine.status_code == 201, mine.content
    assert mine.json()["id"] != theirs.json()["id"]
    assert Run.objects.get(id=mine.json()["id"]).input["message"] == "refund ORD-1039"
    again = alice.post("/api/runs", body, HTTP_IDEMPOTENCY_KEY="ticket-T-1039")
    assert again.status_code == 200 and again.json()["id"] == mine.json()["id"]
    assert Run.objects.filter(dedupe_key="ticket-T-1039").count() == 2


def test_thread_posts_are_bounded_per_user_refused_ones_counted(alice, trainee, settings):
    """A `reject` post refused with 409 took no quota before (only the starts a post makes
    did): each post now takes one of its sender's posts, by the API and the run page alike;
    past them, 429 with Retry-After and nothing stored. Other users keep their own."""
    settings.AGENTRUNS_ACTION_BURST, settings.AGENTRUNS_ACTION_PER_SECOND = 4, 0.001
    first = run_of(post(alice, "t-busy", "hello", agent=AGENT))
    refused = [post(trainee, "t-busy", "me too", multitask="reject") for _ in range(3)]
    assert [r.status_code for r in refused] == [409] * 3
    trainee.client.force_login(trainee.user)
    form = {"text": "from the page", "multitask": "enqueue"}
    assert trainee.client.post(f"/runs/{first.id}/thread/", form).status_code == 302
    over = post(trainee, "t-busy", "again", multitask="reject")
    assert over.status_code == 429 and int(over["Retry-After"]) >= 1
    assert "too many thread posts" in over.json()["error"]
    assert trainee.client.post(f"/runs/{first.id}/thread/", form).status_code == 429
    assert ThreadTurn.objects.filter(thread_id="t-busy").count() == 2  # hello, the page's
    assert post(alice, "t-busy", "still mine").status_code == 202


def test_ids_end_where_they_end(alice):
    answer = alice.post("/api/threads/t-nl%0A/messages", {"text": "hi", "agent": AGENT})
    assert answer.status_code == 404, answer.content
    body = {"agent": AGENT, "input": {"message": "m"}, "thread": "t-nl\n"}
    assert alice.post("/api/runs", body).status_code == 400
    chat = alice.post(f"/api/chat/{AGENT}", {"id": "c-nl\n", "messages": chat_messages("hi")})
    assert chat.status_code == 400, chat.content
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_a_double_submit_of_a_chat_reply_to_a_waiting_run_is_one_reply(alice):
    asking = run_of(post(alice, "t-conv", "ask me", agent=ASK))
    assert advance(asking).status == RunStatus.WAITING
    body = {"id": "t-conv", "messages": chat_messages("ask me", "ORD-2")}
    first = alice.post(f"/api/chat/{ASK}", body)
    assert first.status_code == 200, first.content[:300]
    assert first["x-run-id"] == str(asking.id)  # it answered the wait
    again = alice.post(f"/api/chat/{ASK}", body)
    assert again.status_code == 200 and again["x-run-id"] == str(asking.id)
    assert Run.objects.filter(thread_id="t-conv").count() == 1
