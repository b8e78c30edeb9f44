"""The model provider's rate limit, kept before each request (runtime/access/model_limits.py).

On the real PostgreSQL: the shared bucket gives every request its own slot, spread evenly (one
statement each, from any number of connections at once); an executor waits for its slot before
each request; in a worker (a pool to hand the run back to) a run whose slot is far off backs off
without a thread, says so, and is woken before its slot to send the request on it; a run woken
after its slot reserves a new one. The bucket on SQLite, and AGENTRUNS_MODEL_LIMITS refused
loudly when it is malformed.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.test import Client
from django.urls import reverse
from django_q.models import OrmQ

from agentruns.conf import ModelLimit, conf, parse_model_limits
from agentruns.models import ModelRateBucket, Run, RunStatus, Step
from agentruns.registry import Agent, ScriptedTurn, register_agent
from agentruns.runtime.access import model_limits
from agentruns.runtime.dispatch import claims
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.engine.model.slot import _waits_at_the_wire
from agentruns.runtime.execution import transitions
from agentruns.runtime.outages.model_outage import latest_queued_event
from agentruns.runtime.providers import ModelError
from agentruns.runtime.providers.base import NOT_BEFORE
from agentruns.runtime.providers.models import model_for
from agentruns.services import start_run
from scripts.fake_openai_server import Fail, FakeOpenAI
from tests.helpers import ApiClient, steps
from tests.model_requests import ask, conversation, params
from tests.procs import base_env, manage, sqlite_env
from tests.sqlite_templates import migrated_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

CLOCK_SLACK = 1e-4  # seconds: the bucket reads the clock at each use in its statement
SENT: list[float] = []  # time.time() of each request the limited agent's model received


def _timed_policy(messages: list[dict]) -> ScriptedTurn:
    """Three model requests: two that call a read-only tool, then the answer."""
    SENT.append(time.time())
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn < 2:
        return ScriptedTurn(text="", tool_calls=[("t_echo", {"text": f"turn {turn}"})])
    return ScriptedTurn(text="done")


AGENT = "limited-script"
register_agent(
    Agent(name=AGENT, instructions="Be brief.", tools=["t_echo"], scripted_policy=_timed_policy)
)
LINED = "limited-lined"  # one run per order at a time (a concurrency key)
register_agent(
    Agent(name=LINED, instructions="Be brief.", tools=["t_echo"], scripted_policy=_timed_policy),
    concurrency_key=lambda run_input: run_input.get("order"),
)


@pytest.fixture(autouse=True)
def _clean():
    SENT.clear()
    yield
    SENT.clear()


def _limit(settings, **limit: int) -> None:
    settings.AGENTRUNS_MODEL_LIMITS = {"scripted": limit}


def _start() -> Run:
    return start_run(AGENT, {"message": "hello"}, enqueue_task=False).run


def _latest_queued(run: Run) -> dict:
    return latest_queued_event(run.id)


# ------------------------------------------------------------------ the setting
@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "is not valid JSON"),
        ('["gpt-4o"]', "must be a JSON object"),
        ('{"gpt-4o": 60}', "must be an object like"),
        ('{"gpt-4o": {}}', "must be an object like"),
        ('{"gpt-4o": {"rps": 1}}', "unknown key(s) ['rps']"),
        ('{"gpt-4o": {"rpm": 0}}', "rpm=0 is not a positive integer"),
        ('{"gpt-4o": {"rpm": 1.5}}', "rpm=1.5 is not a positive integer"),
        ('{"gpt-4o": {"tpm": "9000"}}', "tpm='9000' is not a positive integer"),
        ('{"gpt-4o": {"rpm": true}}', "rpm=True is not a positive integer"),
        ('{"": {"rpm": 1}}', "a model name must be a non-empty string"),
    ],
)
def test_a_malformed_setting_fails_loudly(settings, raw, message):
    settings.AGENTRUNS_MODEL_LIMITS = raw
    with pytest.raises(ImproperlyConfigured, match="AGENTRUNS_MODEL_LIMITS") as refused:
        conf.load_all()  # what every process does at start-up (AgentRunsConfig.ready)
    assert message in str(refused.value)


def test_the_setting_reads_json_or_a_dict():
    raw = '{"openai/gpt-4o-mini": {"rpm": 500, "tpm": 200000}, "scripted": {"rpm": 60}}'
    assert parse_model_limits("X", raw) == {
        "openai/gpt-4o-mini": ModelLimit(rpm=500, tpm=200000),
        "scripted": ModelLimit(rpm=60),
    }
    assert parse_model_limits("X", {"m": {"tpm": 9}}) == {"m": ModelLimit(tpm=9)}
    assert parse_model_limits("X", "") == {}


# ------------------------------------------------------------------ the bucket
@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.5])
@pytest.mark.parametrize("rpm", [1, 30, 59, 60, 61, 90, 119, 120, 121, 420, 3600, 10_000])
def test_slots_keep_the_limit_even_when_requests_arrive_late(rpm, jitter):
    """Slots `interval` apart, each request arriving up to `jitter` late. Worst case: cap + 1
    consecutive requests, the first as late as allowed, the last on time: no window of a second
    may hold more than ceil(rpm / 60) of them, none of a minute more than rpm. A provider that
    refills one request at a time (at most one a second) refuses one that comes before the
    refill: the gap, less the jitter, is at least 60 / rpm."""
    interval = model_limits.request_interval(rpm, jitter)
    per_second = math.ceil(rpm / 60)
    for window, cap in ((1.0, per_second), (60.0, rpm)):
        assert cap * interval - jitter >= window - 1e-9, (rpm, window, interval)
    if per_second == 1:
        assert interval - jitter >= 60 / rpm - 1e-9
    # and no slower than the limit needs: the tightest of those three bounds, no more
    assert interval == pytest.approx(
        max((60 + jitter) / rpm, (1 + jitter) / per_second, (60 / rpm + jitter) * (per_second == 1))
    )


def test_each_request_gets_its_own_slot_spread_evenly_across_connections():
    limit = ModelLimit(rpm=600)  # a slot every 0.1 s (at most 10 in any second)
    slots: list[float] = []
    lock = threading.Lock()

    def reserve_five() -> None:
        try:
            for _ in range(5):
                slot = model_limits.reserve("m-threads", limit).at  # the database's clock
                with lock:
                    slots.append(slot)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reserve_five) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    slots.sort()
    gaps = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    interval = model_limits.request_interval(600)
    assert len(slots) == 20
    assert min(gaps) == pytest.approx(interval), gaps  # never closer than the interval
    row = ModelRateBucket.objects.get(model="m-threads")
    assert row.next_request_at == pytest.approx(row.slot + interval)


def test_a_reservation_that_waited_for_the_bucket_is_not_told_to_send_late():
    """A reservation that queued behind another on the model's row (hundreds of runs reserving
    at once) gets its slot and its wait from the clock once it holds the row, not from when
    its statement started: sent after that wait, it leaves on its slot."""
    limit = ModelLimit(rpm=100)  # a slot every 0.6125 s
    model_limits.reserve("m-queued", limit)  # the row exists
    held = threading.Event()
    got: list[tuple[float, float]] = []  # (the slot, when the wait says to send)

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                got.append(model_limits.reserve("m-queued", limit))
                held.set()
                time.sleep(0.8)  # another reservation queues behind this one meanwhile
        finally:
            connections.close_all()

    def queue_behind() -> None:
        try:
            slot = model_limits.reserve("m-queued", limit)
            got.append((slot.at, time.time() + slot.wait))
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    held.wait(5)
    behind = threading.Thread(target=queue_behind)
    behind.start()
    holder.join()
    behind.join()
    first, (slot, send_at) = got
    assert slot == pytest.approx(first.at + model_limits.request_interval(100), abs=CLOCK_SLACK)
    # the database's clock is this machine's: sending at `send_at` is sending on the slot
    assert abs(send_at - slot) < 0.1, send_at - slot  # (before: the row's 0.8 s wait late)


def test_tokens_a_minute_space_requests_by_what_the_previous_ones_used():
    limit = ModelLimit(tpm=6000)  # 100 tokens a second
    first = model_limits.reserve("m-tokens", limit, tokens=300)
    assert first.wait == 0  # the first goes now
    second = model_limits.reserve("m-tokens", limit, tokens=50)
    # (the clock is read at each use in the statement, microseconds apart: CLOCK_SLACK)
    assert second.at - first.at == pytest.approx(300 * 60.25 / 6000, abs=CLOCK_SLACK)
    third = model_limits.reserve("m-tokens", limit, tokens=10)
    assert third.at - second.at == pytest.approx(50 * 60.25 / 6000, abs=CLOCK_SLACK)
    both = ModelLimit(rpm=6, tpm=6000)  # the later of the two limits decides
    first = model_limits.reserve("m-both", both, tokens=10)
    second = model_limits.reserve("m-both", both, tokens=10)
    assert second.at - first.at == pytest.approx(model_limits.request_interval(6), abs=CLOCK_SLACK)


def test_the_tokens_charged_are_the_prompt_and_max_tokens_or_the_last_answer(settings):
    class State:
        run = Run(model="openai/m")
        agent = Agent(name="x", instructions="", model_settings={"max_tokens": 256})
        steps: list = []

    # the request's messages and tool declarations as JSON (engine/model/slot.py measures them)
    messages = len('[{"role": "user", "content": ""}]' + '[{"name": "t", "parameters": {}}]') + 400
    prompt = messages // 4
    assert model_limits.request_tokens(State, messages) == prompt + 256
    State.agent = Agent(name="x", instructions="")
    settings.OPENAI_REQUEST_OPTIONS = '{"max_completion_tokens": 64}'
    assert model_limits.request_tokens(State, messages) == prompt + 64
    settings.OPENAI_REQUEST_OPTIONS = ""
    State.steps = [
        Step(kind="model", status="succeeded", completion_tokens=70),
        Step(kind="tool", status="succeeded"),
        Step(kind="model", status="running"),  # the request being charged
    ]
    assert model_limits.request_tokens(State, messages) == prompt + 70


def test_the_bucket_is_one_statement_on_sqlite_too(tmp_path):
    env = base_env(**sqlite_env(tmp_path / "db.sqlite3", "http://127.0.0.1:1"))
    migrated_sqlite(tmp_path / "db.sqlite3")
    code = (
        "from agentruns.conf import ModelLimit\n"
        "from agentruns.runtime.access.model_limits import reserve\n"
        "slots = [reserve('m', ModelLimit(rpm=120)).at for _ in range(4)]\n"
        "print(' '.join(f'{s - slots[0]:.3f}' for s in slots))"
    )
    out = manage(env, "shell", "-c", code).strip().splitlines()[-1]
    # 120 a minute, 2 a second: a slot every (1 + 0.25) / 2 s
    assert [float(w) for w in out.split()] == pytest.approx([0, 0.625, 1.25, 1.875], abs=0.002)


# ------------------------------------------------------------------ the executor
def test_a_tokens_a_minute_limit_charges_each_request_its_prompt(settings):
    """Under a tpm limit each request is charged its prompt (the request's messages and tool
    declarations): the bucket's next token time moves past the last slot by that charge."""
    _limit(settings, tpm=6_000_000)  # 100,000 tokens a second: no request waits long
    assert RunExecutor(_start().id).advance() == RunStatus.SUCCEEDED
    bucket = ModelRateBucket.objects.get(model="scripted")
    assert len(SENT) == 3
    assert bucket.next_token_at > bucket.slot  # the last request's prompt was charged


def test_in_process_each_request_waits_for_its_slot(settings):
    _limit(settings, rpm=120)  # a slot every 0.625 s
    first, second = _start(), _start()
    assert RunExecutor(first.id).advance() == RunStatus.SUCCEEDED
    assert RunExecutor(second.id).advance() == RunStatus.SUCCEEDED
    interval = model_limits.request_interval(120)
    gaps = [b - a for a, b in zip(SENT, SENT[1:], strict=False)]
    assert len(SENT) == 6
    assert min(gaps) >= interval - 0.1, gaps  # (a busy machine wakes a thread late); unlimited: ms
    assert [s.tool for s in steps(second, kind="tool")] == ["t_echo", "t_echo"]


def test_a_run_whose_slot_is_far_off_backs_off_without_a_thread_and_says_so(
    settings, django_user_model
):
    """In a worker: the second request's slot is 5.25 s away, more than the wake lead (the claim
    poll + 1 s): the run is queued, leaseless, with the reason and a doorbell due before its
    slot. A stray doorbell before then finds it not due and leaves it on the same slot; woken
    in time it sleeps on its thread until the slot and sends the request then."""
    settings.AGENTRUNS_RUN_CLAIM_POLL_SECONDS = 0.2  # wake lead 1.2 s
    _limit(settings, rpm=12)  # a slot every 5 + 0.25 s
    run = _start()
    drain = threading.Event()  # a pool's: the executor may hand the run back
    assert RunExecutor(run.id, drain=drain).advance() == RunStatus.QUEUED
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.lease_owner == ""
    assert run.error == "waiting on the model's rate limit (scripted: 12 requests a minute)"
    held = _latest_queued(run)
    slot = datetime.fromisoformat(held["model_rate_limit"]["slot"]).timestamp()
    assert held["reason"] == "waiting" and held["error"] == run.error
    assert slot == pytest.approx(SENT[0] + model_limits.request_interval(12), abs=0.05)
    # the doorbell rings the wake lead before the slot (q2's ORM queue: `lock` = not before)
    (doorbell,) = OrmQ.objects.all()
    assert doorbell.lock.timestamp() == pytest.approx(slot - 1.2, abs=0.01)
    # woken early (a stray doorbell): not due, so not claimed; the same slot, no new
    # reservation, no thread kept
    reserved = ModelRateBucket.objects.get(model="scripted").next_request_at
    assert RunExecutor(run.id, drain=drain).advance() == "busy"
    assert _latest_queued(run)["model_rate_limit"] == held["model_rate_limit"]
    assert ModelRateBucket.objects.get(model="scripted").next_request_at == reserved
    assert len(SENT) == 1

    # the API and the run page say it
    lead = django_user_model.objects.create_superuser("lead", "l@example.com", "pw")
    assert ApiClient(lead).get(f"/api/runs/{run.id}").json()["error"] == run.error
    browser = Client()
    browser.force_login(lead)
    page = browser.get(reverse("run-detail", args=[run.id])).content.decode()
    assert "Waiting on the model&#x27;s rate limit (scripted: 12 requests" in page  # its banner

    # woken as its doorbell would: it waits on its thread and sends on the slot
    time.sleep(max(0.0, slot - 1.2 - time.time()))
    outcome = RunExecutor(run.id, drain=drain).advance()
    assert SENT[1] >= slot and SENT[1] - slot < 0.1, SENT[1] - slot
    assert outcome == RunStatus.QUEUED  # its third request's slot is 5 s away again
    run.refresh_from_db()
    assert run.error.startswith("waiting on the model's rate limit")


def test_a_run_woken_after_its_slot_reserves_a_new_one(settings):
    settings.AGENTRUNS_RUN_CLAIM_POLL_SECONDS = 0.2
    _limit(settings, rpm=20)
    run = _start()
    drain = threading.Event()
    assert RunExecutor(run.id, drain=drain).advance() == RunStatus.QUEUED
    old = _latest_queued(run)["model_rate_limit"]["slot"]
    old_slot = datetime.fromisoformat(old).timestamp()
    time.sleep(max(0.0, old_slot + 0.3 - time.time()))  # a worker far too busy
    assert RunExecutor(run.id, drain=drain).advance() == RunStatus.QUEUED
    new = datetime.fromisoformat(_latest_queued(run)["model_rate_limit"]["slot"]).timestamp()
    assert len(SENT) == 1  # nothing sent on the stale slot
    assert new == pytest.approx(old_slot + model_limits.request_interval(20), abs=0.05)


def test_a_run_backing_off_for_its_slot_keeps_its_concurrency_key_and_its_line(settings):
    """Two runs on one order (concurrency 1), the second of higher priority: while the first
    backs off for its slot it still holds the key, so the second stays in the line behind it,
    and neither is claimable; the first is claimable from its slot less the wake lead (its
    `enqueued_at`), the second only once the first has ended."""
    settings.AGENTRUNS_RUN_CLAIM_POLL_SECONDS = 0.2  # wake lead 1.2 s
    _limit(settings, rpm=30)  # a slot every 2 + 0.25 s
    first = start_run(LINED, {"message": "hi", "order": "ORD-7"}, enqueue_task=False).run
    second = start_run(
        LINED, {"message": "hi", "order": "ORD-7"}, enqueue_task=False, priority=5
    ).run
    assert RunExecutor(first.id, drain=threading.Event()).advance() == RunStatus.QUEUED
    # the request that backed off for its slot is the next one sent: the second, or on a slow
    # machine the third (the second's slot came before a back-off was worth it)
    held = len(SENT)
    first.refresh_from_db()
    second.refresh_from_db()
    slot = datetime.fromisoformat(_latest_queued(first)["model_rate_limit"]["slot"])
    assert first.error.startswith(model_limits.WAITING)
    assert first.holds_key and first.waiting_behind is None
    assert first.enqueued_at.timestamp() == pytest.approx(slot.timestamp() - 1.2, abs=0.01)
    assert second.waiting_behind == first.id and second.enqueued_at is None
    assert claims.claim_queued(10, transitions.started().events) == []  # the slot is not due
    time.sleep(max(0.0, first.enqueued_at.timestamp() - time.time()) + 0.05)
    (claimed,) = claims.claim_queued(10, transitions.started().events)
    assert claimed.id == first.id  # the second, though higher, still waits behind it
    # executed as a claimer's thread does (no pool here: it waits for its slots on the thread)
    outcome = RunExecutor(first.id, claimed.lease_owner).advance(claimed=claimed)
    assert outcome == RunStatus.SUCCEEDED and SENT[held] >= slot.timestamp()
    second.refresh_from_db()
    assert second.holds_key and second.waiting_behind is None
    assert [r.id for r in claims.claim_queued(10, transitions.started().events)] == [second.id]


def test_a_model_without_a_limit_is_not_held_back(settings):
    settings.AGENTRUNS_MODEL_LIMITS = {"openai/other": {"rpm": 1}}
    assert RunExecutor(_start().id).advance() == RunStatus.SUCCEEDED
    assert RunExecutor(_start().id).advance() == RunStatus.SUCCEEDED
    assert len(SENT) == 6 and not ModelRateBucket.objects.exists()


def test_an_openai_compatible_request_is_held_at_the_wire_until_its_slot(settings):
    """The executor hands such a request over before its slot (HANDOFF_SECONDS); its client's
    request hook holds it until the slot, so what happens before cannot make it late."""
    with FakeOpenAI(mode="echo") as fake:
        settings.OPENAI_BASE_URL = fake.url
        model = model_for("openai/fake-model")
        assert _waits_at_the_wire(model)
        request = params(
            conversation(
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
            )
        )
        ask(model, request)  # the client built: what follows times the hook alone
        due = time.time() + 0.6
        token = NOT_BEFORE.set(due)
        try:
            wall, mono = time.time(), time.monotonic()
            ask(model, request)
        finally:
            NOT_BEFORE.reset(token)
        arrived = wall + fake.chat_requests()[-1].received_at - mono
    assert due <= arrived < due + 0.3, arrived - due


def test_a_request_under_a_limit_that_gets_a_429_is_not_retried_by_the_sdk(settings):
    """The SDK's own retry of a 429 would go at once, past the shared bucket: under a limit the
    429 reaches the engine (which backs off and takes a new slot); without one the SDK retries
    as before."""
    with FakeOpenAI(mode="echo") as fake:
        settings.OPENAI_BASE_URL = fake.url
        model = model_for("openai/fake-model")
        request = params(conversation([{"role": "user", "content": "hi"}]))
        fake.script(Fail(429, "Rate limit reached for requests.", retry_after=0.05))
        token = NOT_BEFORE.set(time.time() + model_limits.HANDOFF_SECONDS)  # under a limit
        try:
            with pytest.raises(ModelError):
                ask(model, request)
        finally:
            NOT_BEFORE.reset(token)
        assert len(fake.chat_requests()) == 1

        fake.script(Fail(429, "Rate limit reached for requests.", retry_after=0.05))
        ask(model, request)  # no limit: the SDK's retry answers
        assert len(fake.chat_requests()) == 3


def test_a_request_that_would_leave_too_late_after_its_slot_is_not_sent(settings):
    """A process too busy to send a request on time: past half the jitter allowance after its
    slot it is answered unsent (the engine backs off and takes a new slot), never sent late."""
    with FakeOpenAI(mode="echo") as fake:
        settings.OPENAI_BASE_URL = fake.url
        model = model_for("openai/fake-model")
        request = params(conversation([{"role": "user", "content": "hi"}]))
        token = NOT_BEFORE.set(time.time() - conf.MODEL_LIMIT_JITTER_SECONDS)
        try:
            with pytest.raises(ModelError, match="after its rate-limit slot") as raised:
                ask(model, request)
        finally:
            NOT_BEFORE.reset(token)
        assert raised.value.retryable and fake.chat_requests() == []
        token = NOT_BEFORE.set(time.time() + model_limits.HANDOFF_SECONDS)  # handed over early
        try:
            ask(model, request)
        finally:
            NOT_BEFORE.reset(token)
        assert len(fake.chat_requests()) == 1
