"""django-q2's task queue under processes SIGKILLed at any moment (`runtime/workers/q2_cluster.py`).

Real forked processes, as q2 runs them: readers wait in `get()` on the shared queue while a
thread of their own keeps the interpreter busy and kills the process at a random moment, the
way a run thread's crash takes a q2 worker down; the test respawns each dead reader, as q2's
sentinel does. Every reader writes what it got to a file of its own (one `write` per message),
so the evidence is outside the queue under test.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from agentruns.runtime.workers.q2_cluster import (
    FRAME_BYTES,
    MAX_MESSAGE_BYTES,
    MessageQueue,
    MessageTooLarge,
)

pytestmark = pytest.mark.crash

FORK = multiprocessing.get_context("fork")
QUEUE_LIMIT = 2  # q2's queue_limit in settings: Q_WORKERS
KILLS = 60
STOP = "STOP"


def _reader(q: MessageQueue, log_path: str, die_within: float | None) -> None:
    """A q2 worker's loop: take a message, record it. With `die_within`, a busy thread SIGKILLs
    the process at a random moment within that many seconds."""
    if die_within is not None:

        def crash() -> None:
            # a generator of its own: the forked module's one repeats the parent's sequence
            end = time.monotonic() + random.Random().uniform(0, die_within)
            while time.monotonic() < end:  # holds the interpreter lock, like a busy run thread
                sum(range(200))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=crash, daemon=True).start()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for message in iter(q.get, STOP):
        os.write(fd, f"{message}\n".encode())


def _producer(q: MessageQueue, start: int, count: int) -> None:
    """q2's pusher: puts into the bounded queue, waiting while it is full."""
    for number in range(start, start + count):
        q.put(number)


def _received(log_dir: Path) -> list[int]:
    numbers = []
    for path in log_dir.glob("*.log"):
        numbers += [int(line) for line in path.read_text().split()]
    return numbers


def test_readers_killed_at_random_moments_never_stop_the_queue(tmp_path):
    """60 readers die at random points of their `get()` while the producer keeps the queue
    full. Afterwards the queue still delivers every new message, nothing was delivered twice,
    and at most one message was lost per death (the one a dying reader had taken)."""
    q = MessageQueue(maxsize=QUEUE_LIMIT)
    producer = FORK.Process(target=_producer, args=(q, 0, 1_000_000), daemon=True)
    producer.start()
    readers: list = []
    deaths = 0
    try:
        while deaths < KILLS:
            while len(readers) < 2:
                log = tmp_path / f"reader-{deaths}-{time.monotonic_ns()}.log"
                reader = FORK.Process(target=_reader, args=(q, str(log), 0.03), daemon=True)
                reader.start()
                readers.append(reader)
            for reader in list(readers):
                reader.join(timeout=0.1)
                if not reader.is_alive():
                    assert reader.exitcode == -signal.SIGKILL
                    readers.remove(reader)
                    deaths += 1
        producer.kill()
        producer.join()
        for reader in readers:
            reader.kill()
            reader.join()
        before = _received(tmp_path)
        assert len(before) == len(set(before)), "a message was delivered twice"
        assert len(before) > KILLS, f"only {len(before)} messages got through {KILLS} deaths"

        # the queue still works: fresh readers take everything put now
        calm = [
            FORK.Process(target=_reader, args=(q, str(tmp_path / f"calm-{i}.log"), None))
            for i in range(2)
        ]
        for reader in calm:
            reader.start()
        tail = list(range(10_000_000, 10_000_050))
        tail_producer = FORK.Process(target=_producer, args=(q, tail[0], len(tail)))
        tail_producer.start()
        tail_producer.join(timeout=30)
        assert tail_producer.exitcode == 0, "the producer blocked on a queue nobody reads"
        deadline = time.monotonic() + 30
        while not set(tail) <= set(_received(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.05)
        after = _received(tmp_path)
        missing = sorted(set(tail) - set(after))
        assert not missing, f"{len(missing)} of {len(tail)} new messages never arrived"
        assert len(after) == len(set(after)), "a message was delivered twice"
        for _ in calm:
            q.put(STOP)
        for reader in calm:
            reader.join(timeout=10)
            assert reader.exitcode == 0
    finally:
        for process in [producer, *readers]:
            if process.is_alive():
                process.kill()


def test_the_bound_counts_frames_the_kernel_holds():
    """`qsize()` is what waits in the socket; a full bounded queue refuses a non-blocking put;
    a message over a frame counts as several; nothing user-space can drift."""
    q = MessageQueue(maxsize=QUEUE_LIMIT)
    assert q.empty() and q.qsize() == 0
    q.put({"id": "a"})
    q.put({"id": "b"})
    assert q.qsize() == 2 and q.full()
    with pytest.raises(queue.Full):
        q.put_nowait({"id": "c"})
    assert q.get() == {"id": "a"}
    assert q.qsize() == 1
    assert q.get_nowait() == {"id": "b"}
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)

    big = MessageQueue()
    big.put("x" * (3 * FRAME_BYTES))
    assert big.qsize() == 4  # 3 KiB and the header: four frames
    assert big.get() == "x" * (3 * FRAME_BYTES)


def test_a_result_too_large_for_one_message_travels_without_it():
    """A finished q2 task whose result would not fit in one datagram reaches the monitor with a
    note in its place (q2 would store it; ours are short strings); any other oversized message
    is refused at the sender, never cut on the way."""
    q = MessageQueue()
    task = {"id": "t1", "func": "f", "result": "r" * MAX_MESSAGE_BYTES, "success": True}
    q.put(task)
    got = q.get()
    assert got["id"] == "t1" and got["success"] is True
    assert "too large for the queue" in got["result"]
    with pytest.raises(MessageTooLarge):
        q.put(["y" * MAX_MESSAGE_BYTES])
    assert q.empty()
