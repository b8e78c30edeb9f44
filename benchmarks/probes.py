"""Timestamps at the hand-offs of a run's start, recorded inside the real processes without
changing the engine: `python -m benchmarks.probes web|worker ARGS...` installs wrappers around
a few engine methods, then runs daphne (`config.serve ARGS`) or `manage.py qcluster` as usual.
q2 forks its workers from the process that installed them, so they carry the wrappers too.

Every wrapped call appends one JSON line `{"at": "<point>", "run": "<id>", "t": <epoch s>, ...}`
to $PROBE_FILE (one O_APPEND write per line: lines of concurrent processes never interleave).
Used by `benchmarks/profile_worker.py`; each wrapper costs a few microseconds.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_fd: int | None = None


def record(at: str, run: object = "", **extra: object) -> None:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["PROBE_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = {"at": at, "run": str(run), "t": time.time(), "pid": os.getpid(), **extra}
    os.write(_fd, (json.dumps(line) + "\n").encode())


def wrap(owner: Any, name: str, before: str = "", after: str = "", run_of=None) -> None:
    """Record `before` on entry and `after` on return of owner.name; `run_of(args)` names the
    run (default: the instance's run_id)."""
    original: Callable = getattr(owner, name)
    run_of = run_of or (lambda args: getattr(args[0], "run_id", ""))

    @functools.wraps(original)
    def probed(*args: Any, **kwargs: Any) -> Any:
        run = run_of(args)
        if before:
            record(before, run, cpu=time.thread_time())
        result = original(*args, **kwargs)
        if after:
            record(after, run, cpu=time.thread_time(), result=str(result)[:40])
        return result

    setattr(owner, name, probed)


def wrap_async(owner: Any, name: str, before: str = "", after: str = "", run_of=None) -> None:
    """`wrap` for a coroutine function: the runs of a worker process are tasks of its one event
    loop, so a thread's CPU time is no run's own and only times are recorded."""
    original: Callable = getattr(owner, name)
    run_of = run_of or (lambda args: getattr(args[0], "run_id", ""))

    @functools.wraps(original)
    async def probed(*args: Any, **kwargs: Any) -> Any:
        run = run_of(args)
        if before:
            record(before, run)
        result = await original(*args, **kwargs)
        if after:
            record(after, run, result=str(result)[:40])
        return result

    setattr(owner, name, probed)


def install_web() -> None:
    from agentruns.runtime.store.postgres import PostgresStore
    from agentruns.services import start

    wrap(PostgresStore, "create_run", "insert", "inserted", run_of=lambda a: a[1].id)
    wrap(start, "enqueue", "", "doorbell", run_of=lambda a: a[0])


def install_gc_probe() -> None:
    """The cyclic collector's time in this process, by generation: a cumulative "gc" row at
    every full collection and at most a second apart (the last row of a pid is its total)."""
    spent = [0.0, 0.0, 0.0]
    counts = [0, 0, 0]
    began = [0.0]
    reported = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            began[0] = now
            return
        generation = info["generation"]
        spent[generation] += now - began[0]
        counts[generation] += 1
        if generation == 2 or now - reported[0] >= 1.0:
            reported[0] = now
            record("gc", pid=os.getpid(), seconds=list(spent), counts=list(counts))

    gc.callbacks.append(on_gc)


def install_pool_probe() -> None:
    """In every q2 process, once spawned: its psycopg pool's counters, a cumulative "pool" row
    a second apart (requests, those that had to wait for a connection, their total wait)."""
    import threading

    from django.db import DEFAULT_DB_ALIAS, connections
    from django_q.signals import post_spawn

    def report() -> None:
        while True:
            time.sleep(1.0)
            pool = connections[DEFAULT_DB_ALIAS].pool
            if pool is not None:
                stats = pool.get_stats()
                keys = ("requests_num", "requests_queued", "requests_wait_ms", "pool_size")
                record("pool", pid=os.getpid(), **{k: stats.get(k, 0) for k in keys})

    def spawned(**_: Any) -> None:
        threading.Thread(target=report, name="pool-probe", daemon=True).start()

    post_spawn.connect(spawned, dispatch_uid="benchmarks.pool_probe", weak=False)


def install_worker() -> None:
    install_gc_probe()
    install_pool_probe()
    from agentruns.runtime.dispatch.broker import DoorbellBroker
    from agentruns.runtime.engine.executor import RunExecutor
    from agentruns.runtime.workers.pool import RunPool

    original = DoorbellBroker.dequeue

    def dequeue(self: DoorbellBroker) -> Any:
        tasks = original(self)
        if tasks:
            record("dequeued", n=len(tasks))
        return tasks

    DoorbellBroker.dequeue = dequeue
    # "started", or "requeued" when the process had no free slot (the doorbell rings again)
    wrap(RunPool, "hand_over", "hand_over", "handed", run_of=lambda a: a[1])
    wrap(RunExecutor, "claim", "claim", "claimed")
    # the claim path on PostgreSQL (runtime/dispatch/claims.py): a start NOTIFYs, the process's
    # claimer takes a batch of queued runs straight from the database and starts them in slots
    from agentruns.runtime.dispatch import claims

    original_claim = claims.claim_queued

    def claim_queued(limit: int, events: Any) -> Any:
        record("claim_batch", n=limit)
        claimed = original_claim(limit, events)
        for run in claimed:
            record("claimed", run.id, cpu=time.thread_time())
        return claimed

    claims.claim_queued = claim_queued
    wrap(RunPool, "start_claimed", "hand_over", "handed", run_of=lambda a: a[1].id)
    # a slice and its units are coroutines of the process's loop (engine/backend.py calls the
    # units through their modules)
    from agentruns.runtime.engine.model import unit as model_unit
    from agentruns.runtime.engine.tools import unit as tool_unit

    wrap_async(RunExecutor, "advance_in", "advance", "advanced")
    wrap_async(model_unit, "execute", "model_call", run_of=lambda a: a[0].run.id)
    wrap_async(tool_unit, "execute", "tool_call", run_of=lambda a: a[0].run.id)


def main() -> None:
    role, args = sys.argv[1], sys.argv[2:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    if role == "web":
        install_web()
        import runpy

        sys.argv = ["config.serve", *args]
        runpy.run_module("config.serve", run_name="__main__", alter_sys=True)
    else:
        install_worker()
        from django.core.management import execute_from_command_line

        execute_from_command_line(["manage.py", "qcluster", *args])


if __name__ == "__main__":
    main()
