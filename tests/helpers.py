"""Helpers every kind of test uses: users and an API client, drive a run in-process, read its steps
and events, check an API error, race calls against each other."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.utils import timezone

from agentruns.models import Run, RunEvent, RunStatus, Step, Wait, WaitStatus
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.engine.lanes import process_loop
from agentruns.runtime.waits.due import fire_due_waits
from agentruns.services import start_run
from agentruns.tokens import create_token


def _perm(dotted: str) -> Permission:
    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def make_user(django_user_model, username: str, perms: list[str] = (), superuser: bool = False):
    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if superuser:
        user.is_superuser = user.is_staff = True
        user.save()
    for p in perms:
        user.user_permissions.add(_perm(p))
    return django_user_model.objects.get(pk=user.pk)


class ApiClient:
    """A Django test client that sends a real bearer token on every request."""

    def __init__(self, user) -> None:
        self.token = create_token(user)
        self.client = Client()
        self.user = user

    def _headers(self, extra: dict | None) -> dict:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}", **(extra or {})}

    def get(self, path: str, **extra):
        return self.client.get(path, **self._headers(extra))

    def post(self, path: str, data=None, raw: str | None = None, **extra):
        body = raw if raw is not None else json.dumps(data if data is not None else {})
        return self.client.post(path, body, content_type="application/json", **self._headers(extra))


def script_run(turns: list[dict], agent: str = "script", **run_input: object) -> Run:
    """Start (queue) a run of a scripted test agent (tests/testkit.py) that plays `turns`."""
    return start_run(agent, {"script": turns, **run_input}).run


def leased_run(owner: str = "me:1:abc", ttl_seconds: float = 30) -> Run:
    """A run of the `script` agent (never enqueued) as a worker holds it: running, leased to
    `owner` for `ttl_seconds`."""
    run = start_run("script", {"script": []}, enqueue_task=False).run
    Run.objects.filter(id=run.id).update(
        status="running",
        lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
    )
    return Run.objects.get(id=run.id)


def advance(run: Run) -> Run:
    """Execute the run in this process (as a worker would) until it finishes, parks or yields."""
    RunExecutor(run.id).advance()
    run.refresh_from_db()
    return run


def fire_due_waits_at(when: datetime) -> int:
    """`fire_due_waits(when)`: the waits due by `when` fired as the clock would fire them then
    (a timer of an hour, fired now). The runs they resume are due at `when`, which this test's
    clock has not reached, and a run is not claimed before it is due: they are made due now,
    as if it had."""
    resumed = Wait.objects.filter(status=WaitStatus.PENDING, due_at__lte=when).values("run_id")
    resumed_ids = list(resumed.values_list("run_id", flat=True))
    fired = fire_due_waits(when)
    now = timezone.now()
    Run.objects.filter(id__in=resumed_ids, status=RunStatus.QUEUED, enqueued_at__gt=now).update(
        enqueued_at=now
    )
    return fired


def tasks_on_the_process_loop() -> int:
    """The tasks left on the process's run loop (runtime/engine/lanes.py), none but this count's
    own: what a run, a stream or a request started there and did not end. Counted until none are
    left or 5 s passed (a cancelled task may take a moment to finish)."""

    async def others() -> int:
        return len(asyncio.all_tasks()) - 1

    deadline = time.monotonic() + 5
    while True:
        left = asyncio.run_coroutine_threadsafe(others(), process_loop()[0]).result(timeout=5)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


def _run_id(run: Run | uuid.UUID | str) -> uuid.UUID | str:
    return run.id if isinstance(run, Run) else run


def steps(run: Run | uuid.UUID | str, kind: str = "") -> list[Step]:
    """The run's steps in order; only those of `kind` ("model" or "tool") if given."""
    rows = Step.objects.filter(run_id=_run_id(run)).order_by("index")
    return list(rows.filter(kind=kind) if kind else rows)


def events(run: Run | uuid.UUID | str, *types: str) -> list[RunEvent]:
    """The run's events in seq order; only those of `types` if given."""
    rows = RunEvent.objects.filter(run_id=_run_id(run)).order_by("seq")
    return list(rows.filter(type__in=types) if types else rows)


def event_types(run: Run | uuid.UUID | str) -> list[str]:
    return [event.type for event in events(run)]


def assert_gapless(run: Run | uuid.UUID | str) -> None:
    """The run's events are seq 1..last_seq: no hole, no duplicate."""
    run_id = _run_id(run)
    last_seq = Run.objects.values_list("last_seq", flat=True).get(id=run_id)
    seqs = list(
        RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    assert last_seq == len(seqs)


def assert_json_error(response, status: int) -> dict:
    """Every API error is JSON `{"error": ...}` with the given 4xx status."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"]
    return body


def race(*calls: Callable[[], object], timeout: float = 60) -> list[object]:
    """Runs each call in its own thread (so its own database connection), all released at once,
    and returns what each returned or the exception it raised, in the order given."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(position: int, call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=30)
            results[position] = call()
        except Exception as exc:  # the caller asserts on it
            results[position] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a racing call did not return"
    return results
