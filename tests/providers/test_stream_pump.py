"""A streamed model request consumed by one task on the process's stream loop
(providers/stream_pump.py), as the engine's model unit makes it (tests/model_requests.py): the
deltas a caller's `TextSink` takes inside the stream, a caller that stops early, a caller on a
thread whose event loop is already running (Playwright's sync API, a notebook), and many callers'
streams sharing the one loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connections

from agentruns.models import RunEvent
from agentruns.registry.pydantic_agents.calls import thread_loop
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.providers import TextSink
from agentruns.runtime.providers.models import model_for, streams, waits
from agentruns.runtime.providers.stream_pump import STREAM_THREAD, stream_loop
from agentruns.services import execute_inline
from tests.helpers import assert_gapless
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
    stream_loop()  # started before the tests count threads
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
    """The process's threads but the stream loop's (every stream runs on that one)."""
    return {t for t in threading.enumerate() if t.name != STREAM_THREAD}


def _tasks_on_the_stream_loop() -> int:
    async def others() -> int:
        return len(asyncio.all_tasks()) - 1

    return asyncio.run_coroutine_threadsafe(others(), stream_loop()[0]).result(timeout=5)


def _taking_after_the_first(model) -> tuple[list[str], tuple, list[str], set[int]]:
    """(what the stream yielded, the turn it returned, what the sink took, the threads `take`
    ran on): `take` is set once the first delta is out, as the model unit does after its first
    commit."""
    sink = TextSink()
    taken: list[str] = []
    threads: set[int] = set()

    def take(text: str) -> None:
        threads.add(threading.get_ident())
        taken.append(text)

    yielded = []
    with playing_refund():
        chunks = stream(model, first_turn(), sink)
        try:
            while True:
                yielded.append(next(chunks))
                sink.take = take
        except StopIteration as end:
            response = end.value
    return yielded, turn_of(response), taken, threads


def _asked() -> tuple[list[str], tuple]:
    with playing_refund():
        deltas, response = ask(model_for("scripted"), first_turn())
    return deltas, turn_of(response)


def test_a_streaming_model_called_from_a_thread_whose_loop_runs_streams_its_turn(streaming):
    """The bug: `model_request_stream_sync` refuses a running loop ("Cannot use a synchronous
    streaming method from within an async context"), which failed the run's model step."""
    before = _threads()
    assert _in_a_running_loop(_asked) == (FIRST_TURN_TOKENS, FIRST_TURN)
    assert _threads() <= before  # no thread of its own: on the stream loop


def test_after_the_first_delta_the_sink_takes_the_rest_inside_the_stream(streaming):
    yielded, turn, taken, threads = _taking_after_the_first(streaming)
    assert yielded == FIRST_TURN_TOKENS[:1] and turn == FIRST_TURN
    assert yielded[0] + "".join(taken) == FIRST_TURN_TEXT
    assert threads == {stream_loop()[1].ident}  # inside the stream, on the process's stream loop


def test_from_a_running_loop_the_sink_takes_the_rest_on_the_streams_thread(streaming):
    before = _threads()
    yielded, turn, taken, threads = _in_a_running_loop(lambda: _taking_after_the_first(streaming))
    assert yielded[0] + "".join(taken) == FIRST_TURN_TEXT
    assert turn == FIRST_TURN  # its tool call and usage
    assert threading.get_ident() not in threads
    assert _threads() <= before


def test_what_the_sink_raises_ends_the_stream_and_is_raised_as_it_is(streaming):
    """A lost lease inside the stream is the engine's, never a model error to retry."""
    sink = TextSink()

    def take(text: str) -> None:
        raise LeaseLost("run-1")

    with pytest.raises(LeaseLost), playing_refund():
        for _ in stream(streaming, first_turn(), sink):
            sink.take = take
    assert _tasks_on_the_stream_loop() == 0


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
    assert _tasks_on_the_stream_loop() == 0  # cancelled and finished before close() returned
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


def test_many_threads_stream_their_turns_on_the_one_stream_loop(streaming):
    """Each run thread's turn streams on the process's loop, whole and in order per stream; the
    run threads' own loops run nothing."""
    results: dict[int, tuple[list[str], tuple, list[str], set[int]]] = {}
    loops_used: set[int] = set()

    def one(number: int) -> None:
        results[number] = _taking_after_the_first(streaming)
        if not thread_loop().is_closed():
            loops_used.add(len(asyncio.all_tasks(thread_loop())))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results) == list(range(20))
    for yielded, turn, taken, on in results.values():
        assert yielded[0] + "".join(taken) == FIRST_TURN_TEXT
        assert turn == FIRST_TURN
        assert on == {stream_loop()[1].ident}
    assert loops_used <= {0} and _tasks_on_the_stream_loop() == 0
