"""Quotas (runtime/access/quotas.py): the start and hook buckets shared by real web processes,
the cap on runs in flight, the decision bucket, and agent inputs (extra keys, a size cap per
key).

The burst test drives two real daphne processes on the test database with bearer tokens: a
bucket per process would let each grant its own 100. The two are the module's (`two_webs`), shared
with the hook test; each test's user has buckets of its own."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection, transaction
from django.test import Client

from agentruns.models import Run, RunStatus
from agentruns.runtime.access import quotas
from agentruns.runtime.store.pg_function import IN_FLIGHT_LOCK
from agentruns.services import execute_inline, fork_run, start_run
from agentruns.tokens import create_token
from approvals.models import Approval, ApprovalStatus
from tests.approvals.kit import bulk_pending, login
from tests.helpers import ApiClient, assert_json_error, make_user, race
from tests.procs import base_env, manage, module_web, sqlite_env
from tests.sqlite_templates import migrated_sqlite

REFUND_INPUT = {"order_id": "ORD-1001", "message": "The blender arrived broken"}
STARTER = ["agentruns.view_run", "agentruns.start_run"]


@pytest.fixture(scope="module")
def two_webs(tmp_path_factory, django_db_setup, django_db_blocker):
    """Two daphne processes on the test database: the default start burst (100) with a slow
    refill, so what a burst's own duration refills is small."""
    env = {"AGENTRUNS_START_PER_SECOND": "0.5"}
    with module_web(tmp_path_factory, django_db_blocker, **env) as first:
        with module_web(tmp_path_factory, django_db_blocker, **env) as second:
            yield first, second


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_100_passes_and_the_rest_get_429_across_two_web_processes(
    two_webs, django_user_model
):
    trainee = make_user(django_user_model, "trainee", STARTER)
    token = create_token(trainee)
    clients = [httpx.Client(base_url=u, timeout=60) for u in two_webs]
    auth = {"Authorization": f"Bearer {token}"}

    def start(n: int) -> httpx.Response:
        body = {"agent": "refund", "input": {"order_id": f"ORD-{1001 + n % 50}"}}
        return clients[n % 2].post("/api/runs", json=body, headers=auth)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(start, range(140)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {201, 429}, [a.text for a in answers if a.status_code not in (201, 429)]
    granted = statuses.count(201)
    # 100 at once, plus what 0.5/s refilled while the burst lasted (well under a minute)
    assert 100 <= granted <= 125, granted
    refused = [a for a in answers if a.status_code == 429]
    assert len(refused) == 140 - granted
    for answer in refused:
        assert int(answer.headers["Retry-After"]) >= 1
        assert "too many runs started" in answer.json()["error"]
    # a refusal created nothing: exactly the granted runs exist
    assert Run.objects.filter(created_by=trainee).count() == granted


@pytest.mark.django_db
def test_the_runs_in_flight_cap_refuses_until_one_finishes(settings, django_user_model):
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = 3
    api = ApiClient(make_user(django_user_model, "trainee", STARTER))
    for _ in range(3):
        assert api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT}).status_code == 201
    refused = api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT})
    assert "runs in flight" in assert_json_error(refused, 429)["error"]
    assert refused["Retry-After"] == str(quotas.IN_FLIGHT_RETRY_SECONDS)
    assert Run.objects.filter(created_by=api.user).count() == 3
    done = Run.objects.filter(created_by=api.user).first()
    done.status = RunStatus.SUCCEEDED
    done.save(update_fields=["status"])
    assert api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT}).status_code == 201


IN_FLIGHT_RACE = """
import threading
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from agentruns.models import Run
from agentruns.runtime.access.quotas import QuotaExceeded
from agentruns.services import start_run
user = get_user_model().objects.create_user("racer", password="x")
user.user_permissions.add(*Permission.objects.filter(codename__in=["start_run", "view_run"]))
user = get_user_model().objects.get(pk=user.pk)
barrier, answers = threading.Barrier(60), []
def start():
    barrier.wait()
    try:
        start_run("refund", {"order_id": "ORD-1001", "message": "broken"}, user=user)
        answers.append("started")
    except QuotaExceeded as exc:
        answers.append("refused" if "runs in flight" in str(exc) else repr(exc))
    except Exception as exc:
        answers.append(repr(exc))
    finally:
        connection.close()
threads = [threading.Thread(target=start) for _ in range(60)]
[t.start() for t in threads]
[t.join() for t in threads]
print(sorted(set(answers)), answers.count("started"), Run.objects.filter(created_by=user).count())
"""


@pytest.mark.django_db(transaction=True)
def test_the_in_flight_cap_is_exact_under_60_concurrent_starts(settings, django_user_model):
    """60 starts at once against a cap of 5 (each its own thread and connection, released by a
    barrier): exactly 5 runs exist, the other 55 were refused."""
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = 5
    starter = make_user(django_user_model, "trainee", STARTER)
    for attempt in range(3):  # the old count-then-insert let 10 of 60 through at once
        Run.objects.all().delete()

        def start() -> str:
            try:
                start_run("refund", REFUND_INPUT, user=starter)
                return "started"
            except quotas.QuotaExceeded as exc:
                assert "runs in flight" in str(exc)
                return "refused"

        answers = race(*[start] * 60)
        assert answers.count("started") == 5, (attempt, answers)
        assert answers.count("refused") == 55, answers
        assert Run.objects.filter(created_by=starter).count() == 5


def _hold_in_flight_lock(
    user_id: int, how: str, held: threading.Event, go: threading.Event
) -> None:
    """In a transaction of its own, the user's in-flight lock (`how`: "shared", as an
    uncommitted start far below its cap holds it, or "exclusive", as one counting exactly),
    until `go`."""
    suffix = "_shared" if how == "shared" else ""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"SELECT pg_advisory_xact_lock{suffix}(hashtextextended(%s || %s, 0))",
                [IN_FLIGHT_LOCK, str(user_id)],
            )
            held.set()
            go.wait(30)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_starts_far_below_the_cap_do_not_wait_for_each_others_commits(settings, django_user_model):
    """One user's starts, each alone in its transaction and far below the cap (its count plus
    the server's connections), take the user's in-flight lock shared: another start of theirs
    not committed yet does not hold them up. A start counting exactly (the lock exclusive: near
    the cap, or inside a caller's transaction) does, until it commits."""
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = 1_000_000
    starter = make_user(django_user_model, "integration", STARTER)
    for how, waits in (("shared", False), ("exclusive", True)):
        held, go, started = threading.Event(), threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold_in_flight_lock, args=(starter.pk, how, held, go))
        holder.start()
        assert held.wait(10)

        def start(started: threading.Event) -> None:
            try:
                start_run("refund", REFUND_INPUT, user=starter)
                started.set()
            finally:
                connection.close()

        starting = threading.Thread(target=start, args=(started,))
        starting.start()
        assert started.wait(1 if waits else 10) is not waits, how
        go.set()
        holder.join(10)
        assert started.wait(10), how
        starting.join(10)
    assert Run.objects.filter(created_by=starter).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_cap_is_exact_near_it_above_the_servers_connections(settings, django_user_model):
    """A cap above the server's max_connections, 3 runs under it: the starts' shared counts
    cannot decide (count + connections > cap), so each counts again exclusive: of 30 concurrent
    starts exactly 3 pass."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        connections = int(cursor.fetchone()[0])
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = cap = connections + 10
    starter = make_user(django_user_model, "integration", STARTER)
    first = start_run("refund", REFUND_INPUT, user=starter).run
    with connection.cursor() as cursor:  # copies of it, queued: cap - 3 in flight in all
        cursor.execute(
            "INSERT INTO agentruns_run SELECT (jsonb_populate_record(NULL::agentruns_run, "
            "to_jsonb(r) || jsonb_build_object('id', gen_random_uuid()))).* "
            "FROM agentruns_run r, generate_series(1, %s) WHERE r.id = %s",
            [cap - 4, first.id],
        )
    assert Run.objects.filter(created_by=starter, status=RunStatus.QUEUED).count() == cap - 3

    def start() -> str:
        try:
            start_run("refund", REFUND_INPUT, user=starter)
            return "started"
        except quotas.QuotaExceeded:
            return "refused"

    answers = race(*[start] * 30)
    assert (answers.count("started"), answers.count("refused")) == (3, 27), answers
    assert Run.objects.filter(created_by=starter).count() == cap


@pytest.mark.django_db(transaction=True)
def test_the_in_flight_cap_is_exact_under_concurrent_forks(settings, django_user_model, seeded):
    """A fork inserts its run by itself; 40 forks at once against a cap of 5 leave exactly 5
    (the old count-then-insert of fork let more through)."""
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = 5
    source, _ = execute_inline("refund", REFUND_INPUT)  # finished, step 0 is its first model turn
    starter = make_user(django_user_model, "forker", STARTER)

    def fork() -> str:
        try:
            fork_run(source.id, 0, user=starter)
            return "forked"
        except quotas.QuotaExceeded as exc:
            assert "runs in flight" in str(exc)
            return "refused"

    answers = race(*[fork] * 40)
    assert answers.count("forked") == 5, answers
    assert Run.objects.filter(created_by=starter).count() == 5


def test_the_in_flight_cap_is_exact_on_sqlite_too(tmp_path):
    """The embedded default: the check and the insert under SQLite's write lock."""
    env = base_env(
        **sqlite_env(tmp_path / "db.sqlite3", "http://127.0.0.1:1"),
        AGENTRUNS_RUNS_IN_FLIGHT_PER_USER=5,
    )
    migrated_sqlite(tmp_path / "db.sqlite3")
    out = manage(env, "shell", "-c", IN_FLIGHT_RACE).strip().splitlines()[-1]
    assert out == "['refused', 'started'] 5 5", out


@pytest.mark.django_db
def test_a_start_refused_by_the_in_flight_cap_costs_no_token(settings, django_user_model):
    """The cap is checked with the insert, after the start bucket: a refusal gives its token back,
    so a user held at the cap is not also drained of starts for when their runs finish."""
    settings.AGENTRUNS_RUNS_IN_FLIGHT_PER_USER = 2
    settings.AGENTRUNS_START_BURST, settings.AGENTRUNS_START_PER_SECOND = 3, 0.001
    api = ApiClient(make_user(django_user_model, "trainee", STARTER))
    body = {"agent": "refund", "input": REFUND_INPUT}
    assert [api.post("/api/runs", body).status_code for _ in range(2)] == [201, 201]
    for _ in range(5):
        assert "runs in flight" in assert_json_error(api.post("/api/runs", body), 429)["error"]
    Run.objects.filter(created_by=api.user).update(status=RunStatus.SUCCEEDED)
    assert api.post("/api/runs", body).status_code == 201  # the burst's third token
    refused = api.post("/api/runs", body)
    assert "too many runs started" in assert_json_error(refused, 429)["error"]


@pytest.mark.django_db
def test_the_start_page_answers_429_with_a_message(settings, client, django_user_model):
    settings.AGENTRUNS_START_BURST, settings.AGENTRUNS_START_PER_SECOND = 1, 0.001
    client.force_login(make_user(django_user_model, "trainee", STARTER))
    form = {"agent": "refund", "input": json.dumps(REFUND_INPUT)}
    assert client.post("/runs/new/", form).status_code == 302
    page = client.post("/runs/new/", form)
    assert page.status_code == 429
    assert int(page["Retry-After"]) >= 900
    assert "too many runs started" in page.content.decode()
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_a_zero_burst_turns_the_start_bucket_off(settings, django_user_model):
    settings.AGENTRUNS_START_BURST = 0
    api = ApiClient(make_user(django_user_model, "trainee", STARTER))
    for _ in range(120):
        assert api.post("/api/runs", {"agent": "refund", "input": REFUND_INPUT}).status_code == 201


@pytest.mark.django_db
def test_decisions_have_a_bucket_of_their_own(settings, lead):
    settings.AGENTRUNS_DECISION_BURST, settings.AGENTRUNS_DECISION_PER_SECOND = 2, 0.001
    ids = [a.id for a in bulk_pending(4)]
    api = ApiClient(lead)
    approve = {"decision": "approve"}
    assert api.post(f"/api/approvals/{ids[0]}", approve).status_code == 200
    assert api.post(f"/api/approvals/{ids[1]}", approve).status_code == 200  # the burst's second
    refused = api.post(f"/api/approvals/{ids[2]}", {"decision": "reject", "reason": "no"})
    assert "too many decisions" in assert_json_error(refused, 429)["error"]
    assert int(refused["Retry-After"]) >= 900
    assert Approval.objects.get(id=ids[2]).status == ApprovalStatus.PENDING
    # the inbox's bulk form: each item over the quota is left as it is, and says why
    inbox = login(Client(), lead)
    form = {"ids": [str(ids[3])], "action": "reject", "reason": "no"}
    answer = inbox.post("/approvals/bulk/", form, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    assert "too many decisions" in answer.content.decode()
    assert Approval.objects.get(id=ids[3]).status == ApprovalStatus.PENDING


@pytest.mark.django_db
def test_agent_inputs_refuse_extra_keys_and_huge_values(api):
    extra = api.post("/api/runs", {"agent": "refund", "input": {**REFUND_INPUT, "x": "y"}})
    assert "x" in assert_json_error(extra, 400)["error"]
    huge = {"agent": "script", "input": {"script": [], "blob": "x" * 900_000}}
    assert "at most 20000 per key" in assert_json_error(api.post("/api/runs", huge), 400)["error"]
    assert not Run.objects.exists()


def test_the_bucket_is_one_statement_on_sqlite_too(tmp_path):
    """The embedded default: the same UPSERT on SQLite (its own clock expression, MIN/MAX)."""
    env = base_env(**sqlite_env(tmp_path / "db.sqlite3", "http://127.0.0.1:1"))
    migrated_sqlite(tmp_path / "db.sqlite3")
    code = (
        "from agentruns.runtime.access.quotas import take; import time\n"
        "first = [take('start:1', burst=3, per_second=2) for _ in range(4)]\n"
        "time.sleep(0.6)\n"
        "print([w > 0 for w in first], take('start:1', burst=3, per_second=2) == 0)"
    )
    out = manage(env, "shell", "-c", code).strip().splitlines()[-1]
    assert out == "[False, False, False, True] True"


@pytest.mark.django_db(transaction=True)
def test_150_guessed_hook_tokens_meet_a_bound_across_two_web_processes(two_webs, django_user_model):
    """The audit's 150 concurrent `POST /api/hooks/<random token>` as a user with
    `resolve_hook` got 150 x 404. Spread over two real daphne processes they now meet the
    sender's bucket (shared by both through the database): the default burst of 30 answers 404,
    the rest 429 with Retry-After, whichever process took them."""
    bot = make_user(django_user_model, "carrier-bot", ["agentruns.resolve_hook"])
    token = create_token(bot)
    clients = [httpx.Client(base_url=u, timeout=60) for u in two_webs]
    auth = {"Authorization": f"Bearer {token}"}

    def guess(n: int) -> httpx.Response:
        return clients[n % 2].post(f"/api/hooks/guess-{n:04d}", json={}, headers=auth)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(guess, range(150)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {404, 429}, [a.text for a in answers if a.status_code not in (404, 429)]
    looked_up = statuses.count(404)
    # the burst, plus what 3 a second refilled while the 150 lasted (seconds on a busy machine)
    assert 30 <= looked_up <= 75, looked_up
    for refused in (a for a in answers if a.status_code == 429):
        assert int(refused.headers["Retry-After"]) >= 1
        assert "too many hook resolutions" in refused.json()["error"]
