"""Where runs execute (runtime/engine/lanes.py): every run's agent loop, and its model requests,
as tasks of the process's one event loop; blocking work on lanes. A streamed model request
relayed to a caller (tests/model_requests.py), a caller on a thread whose event loop is already
running (Playwright's sync API, a notebook), a caller that stops early, a failure inside the
stream, and many runs of a worker's pool on the one loop with a few threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import connections

from agentruns.models import Run, RunEvent
from agentruns.runtime.engine.lanes import PROCESS_LOOP_THREAD, process_loop
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.providers.models import model_for, streams, waits
from agentruns.services import execute_inline
from tests.helpers import assert_gapless, tasks_on_the_process_loop
from tests.model_requests import ask, stream
from tests.support.test_refund_agent import (
    FIRST_TURN,
    FIRST_TURN_TEXT,
    FIRST_TURN_TOKENS,
    first_turn,
    playing_refund,
    turn_of,
)


@pytest.fixture
def streaming(settings):
    settings.SCRIPTED_MODEL_DELAY_MS = 2
    model = model_for("scripted")
    assert streams(model) and waits(model)
    process_loop()  # started before the tests count threads
    return model


def _in_a_running_loop(work):
    """`work()` called synchronously from inside a running event loop, as Playwright's sync API
    or a notebook cell calls code (the loop is blocked while it runs)."""

    async def main():
        try:
            return work()
        finally:  # Django keeps a connection per asyncio context: this one's ends with it
            connections.close_all()

    return asyncio.run(main())


def _threads() -> set[threading.Thread]:
    """The process's threads but its run loop's (every stream runs on that one)."""
    return {t for t in threading.enumerate() if t.name != PROCESS_LOOP_THREAD}


def _asked() -> tuple[list[str], tuple]:
    with playing_refund():
        deltas, response = ask(model_for("scripted"), first_turn())
    return deltas, turn_of(response)


def test_a_streaming_model_called_from_a_thread_whose_loop_runs_streams_its_turn(streaming):
    """The bug: `model_request_stream_sync` refuses a running loop ("Cannot use a synchronous
    streaming method from within an async context"), which failed the run's model step."""
    before = _threads()
    assert _in_a_running_loop(_asked) == (FIRST_TURN_TOKENS, FIRST_TURN)
    assert _threads() <= before  # no thread of its own: on the process's loop


def test_the_deltas_are_handed_on_inside_the_request_on_the_process_loop(streaming):
    taken: list[str] = []
    on: set[int] = set()

    def take(text: str) -> None:
        on.add(threading.get_ident())
        taken.append(text)

    with playing_refund():
        chunks = stream(streaming, first_turn(), take)
        try:
            while True:
                next(chunks)
        except StopIteration as end:
            response = end.value
    assert "".join(taken) == FIRST_TURN_TEXT and turn_of(response) == FIRST_TURN
    assert on == {process_loop()[1].ident}


def test_what_handing_a_delta_on_raises_ends_the_stream_and_is_raised_as_it_is(streaming):
    """A lost lease inside the stream is the engine's, never a model error to retry."""

    def take(text: str) -> None:
        raise LeaseLost("run-1")

    with pytest.raises(LeaseLost), playing_refund():
        for _ in stream(streaming, first_turn(), take):
            pass
    assert tasks_on_the_process_loop() == 0


@pytest.mark.parametrize("running_loop", [False, True], ids=["own loop", "running loop"])
def test_a_caller_that_stops_early_ends_the_streams_task(streaming, running_loop):
    def first_delta_then_close():
        with playing_refund():
            chunks = stream(streaming, first_turn())
            first = next(chunks)
            chunks.close()
        return first

    before = _threads()
    call = _in_a_running_loop if running_loop else (lambda work: work())
    assert call(first_delta_then_close) == FIRST_TURN_TOKENS[0]
    assert tasks_on_the_process_loop() == 0
    assert _threads() <= before


@pytest.mark.django_db(transaction=True)  # its writes are not the test's transaction's
@pytest.mark.parametrize("delay_ms", [0, 2], ids=["asked whole", "streamed"])
def test_a_run_advanced_inline_from_a_running_loop_succeeds(settings, monkeypatch, delay_ms):
    """The whole run, as a Playwright sync test or a notebook advances one (Django's ORM is
    allowed there by DJANGO_ALLOW_ASYNC_UNSAFE, as pytest-playwright sets it), with a model that
    streams and with one asked whole (no delay)."""
    settings.SCRIPTED_MODEL_DELAY_MS = delay_ms
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    text = "one two three four five six"
    script = {"script": [{"calls": [["t_echo", {"text": "a"}]]}, {"text": text}]}
    run, outcome = _in_a_running_loop(lambda: execute_inline("script", script))
    assert outcome == "succeeded"
    run.refresh_from_db()
    assert run.status == "succeeded" and run.output == text
    deltas = RunEvent.objects.filter(run=run, type="model.delta", data__step=2).order_by("seq")
    assert "".join(event.data["text"] for event in deltas) == text
    assert_gapless(run)


@pytest.mark.django_db(transaction=True)
def test_a_pools_runs_are_tasks_of_the_one_loop_on_a_few_threads(settings, streaming):
    """Forty streaming runs in flight in a worker's pool at once: each runs to its end, with
    its text whole and in order, while the process holds no thread per run (its database and
    tool threads, started once, are all it adds)."""
    from agentruns.runtime.workers.pool import RunPool
    from agentruns.services import start_run

    settings.SCRIPTED_MODEL_DELAY_MS = 5
    text = " ".join(f"word{n}" for n in range(30))
    script = {"script": [{"calls": [["t_echo", {"text": "a"}]]}, {"text": text}]}
    pool = RunPool(60, name="pool@test", supervise=False)
    ids = [start_run("script", script).run.id for _ in range(40)]
    before = threading.active_count()
    for run_id in ids:
        assert pool.hand_over(str(run_id), wait=0) == "started"
    peak = 0
    deadline = time.monotonic() + 60
    while pool.in_flight and time.monotonic() < deadline:
        peak = max(peak, threading.active_count())
        time.sleep(0.02)
    assert pool.in_flight == 0
    runs = Run.objects.filter(id__in=ids)
    assert sorted(runs.values_list("status", flat=True)) == ["succeeded"] * 40
    for run in runs:
        assert run.output == text
        assert_gapless(run)
    from agentruns.conf import conf

    assert peak - before <= conf.DB_THREADS + conf.TOOL_THREADS + 2  # not one per run
