"""One owner of a process's background threads (`agentruns/runtime/threads.py`): every thread
of the project is started there, so it knows what runs in the process and stops it all
together."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

from agentruns.runtime.threads import OwnedThread, ProcessThreads, process_threads

ROOT = Path(__file__).resolve().parents[2]
STARTERS = ("Thread", "ThreadPoolExecutor", "Timer")
# the registry (below the runtime, so not through its owner) lists a Pydantic AI agent's tools
# at registration on a one-off thread when the caller's own event loop runs (a notebook): the
# issue's bound is two modules that start threads
REGISTRY_ONE_OFF = {"agentruns/registry/pydantic_agents/calls.py"}


def modules_that_start_threads() -> set[str]:
    found = set()
    for package in ("agentruns", "approvals", "support"):
        for path in (ROOT / package).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            if "/migrations/" in name:
                continue
            tree = ast.parse(path.read_text())
            # a bare name starts threads only if it came from the thread modules (a model
            # named `Thread`, a conversation's, does not)
            imported = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)
                and node.module in ("threading", "concurrent.futures")
                for alias in node.names
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    dotted = ast.unparse(node.func)
                    called = dotted.rsplit(".", 1)[-1]
                    if called in STARTERS and ("." in dotted or called in imported):
                        found.add(name)
                if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(base).endswith("Thread") and ast.unparse(base) != "OwnedThread"
                    for base in node.bases
                ):
                    found.add(name)
    return found


def test_threads_start_in_one_module():
    assert modules_that_start_threads() - REGISTRY_ONE_OFF == {"agentruns/runtime/threads.py"}


def test_the_owner_lists_its_threads_and_stops_them_all_together():
    owner = ProcessThreads()
    stop = threading.Event()
    owner.start("looping", lambda: stop.wait(30), stop=stop.set)

    class Loop(OwnedThread):
        name = "owned-loop"

        def run(self) -> None:
            self.stopped.wait(30)

    loop = Loop()
    process = process_threads()
    loop.start()
    pool = owner.executor("senders", 2)
    pool.submit(time.sleep, 0).result()
    assert owner.names() == ["looping", "senders"] and "owned-loop" in process.names()
    started = time.monotonic()
    assert owner.stop_all(timeout=5) == []
    loop.stop()
    loop.join(5)
    assert time.monotonic() - started < 2  # stopped, not timed out
    assert not loop.is_alive() and owner.names() == []
    assert "owned-loop" not in process.names()


def test_a_worker_process_threads_are_the_owners():
    """The run loop, the delta writer and the lease keeper of this process are started (and
    listed) by the owner."""
    from agentruns.runtime.dispatch.lease import Heartbeat
    from agentruns.runtime.engine.lanes import process_loop
    from agentruns.runtime.execution.delta_writer import delta_writer

    process_loop()
    delta_writer()
    beat = Heartbeat(__import__("uuid").uuid4(), "me", 30)
    beat.start()
    beat.stop()
    names = set(process_threads().names())
    assert {"agentruns-runs", "delta-writer", "lease-keeper"} <= names
