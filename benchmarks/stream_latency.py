"""Stream benchmark: event-commit-to-client latency and the engine's delta persistence rate.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.stream_latency [--write-docs]

(`PG_EXTRA_OPTS=" "` keeps PostgreSQL's fsync on: commits cost what they cost in production.)

Latency: one daphne process serves N concurrent viewers (1, 20, 100) of one run, connected with
the real `websockets` client and a bearer token. A separate writer process appends one
`model.delta` event every 50 ms (the engine's default flush interval) through
`RunStore.append`, exactly as every writer does, and notes the monotonic clock when each
commit returned (CLOCK_MONOTONIC is system-wide on Linux, so the viewers' receive times are
comparable). Latency = receive time - commit time, over every (viewer, event) pair.
Two modes: the embedded default (in-memory layer: the writer's nudges cannot reach the web
process, so delivery rides on the AGENTRUNS_STREAM_POLL_SECONDS poll) and Redis (channels_redis
against a redis-server started here). The numbers include the viewers' own scheduling on this
machine: all of it (PostgreSQL, daphne, writer, 100 clients) shares its cores.

Persistence: the engine streams a long scripted model turn with SCRIPTED_MODEL_DELAY_MS=0 and
AGENTRUNS_DELTA_FLUSH_CHARS=1, so every token is its own fenced commit + RunEvent: events per
second is the ceiling the engine sustains for deltas (the default 50 ms / 200 chars batching
needs about 20 per second per streaming run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

VIEWER_COUNTS = (1, 20, 100)
EVENTS_PER_CASE = 400
WARMUP_EVENTS = 20  # per case, not measured: first connections, first template load, pools
WRITE_INTERVAL_S = 0.05
POLL_SECONDS = 0.25  # the default AGENTRUNS_STREAM_POLL_SECONDS
COMMAND = 'PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.stream_latency --write-docs'


def setup_django() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# ---------------------------------------------------------------------------- writer process
def writer_main(run_id: str, count: int, interval: float, out: str) -> None:
    """Append `count` delta events at a steady rate; record when each commit returned."""
    import django

    django.setup()
    from django.db import transaction

    from agentruns.runtime.store import get_store

    lines = []
    next_at = time.monotonic()
    for i in range(count):
        next_at += interval
        committed: list[int] = []
        with transaction.atomic():
            # registered before the store's nudge: runs first, right after COMMIT returns
            transaction.on_commit(lambda done=committed: done.append(time.monotonic_ns()))
            seq = get_store().append(
                run_id, [("model.delta", {"step": 0, "attempt": 1, "text": f"tok{i} "})]
            )
        lines.append(f"{seq} {committed[0]}")
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    Path(out).write_text("\n".join(lines))


# ---------------------------------------------------------------------------- viewers
async def watch(
    url: str,
    origin: str,
    token: str,
    last_seq: int,
    received: list,
    ready: asyncio.Event,
    counter: list,
) -> None:
    from websockets.asyncio.client import connect

    async with connect(
        url,
        origin=origin,
        additional_headers={"Authorization": f"Bearer {token}"},
        max_queue=None,
        open_timeout=60,
        ping_interval=None,
    ) as ws:
        counter[0] += 1
        if counter[0] == counter[1]:
            ready.set()
        while True:
            raw = await ws.recv()
            now = time.monotonic_ns()
            # frames start with {"seq":N, (stream.frames.encode_frame): skip a full JSON parse, the
            # viewers share this machine with the server being measured
            seq = (
                int(raw[7 : raw.index(",")])
                if raw.startswith('{"seq":')
                else json.loads(raw)["seq"]
            )
            received.append((seq, now))
            if seq >= last_seq:
                return


async def run_viewers(
    base_url: str, run_id: str, token: str, n: int, last_seq: int, start_writer
) -> list[list[tuple[int, int]]]:
    url = base_url.replace("http://", "ws://") + f"/ws/runs/{run_id}/?after=0"
    ready = asyncio.Event()
    counter = [0, n]
    results: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    tasks = [
        asyncio.create_task(watch(url, base_url, token, last_seq, results[i], ready, counter))
        for i in range(n)
    ]
    await asyncio.wait_for(ready.wait(), timeout=120)
    await asyncio.sleep(1.0)  # let every consumer finish subscribing before the first commit
    writer = start_writer()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    writer.wait(timeout=60)
    return results


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def latency_case(base_url: str, token: str, user, n: int, env: dict[str, str], tmp: Path) -> dict:
    from agentruns.models import Run

    run = Run.objects.create(agent="bench-stream", input={}, status="running", created_by=user)
    out = tmp / f"commits-{run.id}.txt"

    def start_writer() -> subprocess.Popen:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.stream_latency",
                "--writer",
                str(run.id),
                str(EVENTS_PER_CASE),
                str(WRITE_INTERVAL_S),
                str(out),
            ],
            cwd=ROOT,
            env=env,
        )

    results = asyncio.run(
        run_viewers(base_url, str(run.id), token, n, EVENTS_PER_CASE, start_writer)
    )
    committed = {}
    for line in out.read_text().splitlines():
        seq, t = line.split()
        committed[int(seq)] = int(t)
    latencies = []
    for received in results:
        seqs = [s for s, _ in received]
        assert seqs == list(range(1, EVENTS_PER_CASE + 1)), "a viewer saw a gap or a duplicate"
        latencies.extend((t - committed[s]) / 1e6 for s, t in received if s > WARMUP_EVENTS)
    return {
        "viewers": n,
        "frames": len(latencies),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
        "mean": statistics.fmean(latencies),
    }


def start_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    from tests.procs import start_redis as start_server

    server = start_server(tmp)
    return server.popen, server.url


def latency_benchmarks(tmp: Path) -> list[dict]:
    from django.contrib.auth import get_user_model

    from agentruns.tokens import create_token
    from tests import binaries
    from tests.procs import base_env, start_web

    user, _ = get_user_model().objects.get_or_create(
        username="bench-viewer", defaults={"is_superuser": True, "is_staff": True}
    )
    token = create_token(user)
    rows = []
    for mode in ("poll", "redis"):
        redis_proc = None
        extra = {"AGENTRUNS_STREAM_POLL_SECONDS": str(POLL_SECONDS), "LOG_LEVEL": "WARNING"}
        if mode == "redis":
            try:
                redis_proc, redis_url = start_redis(tmp)
            except binaries.Missing as exc:
                print(f"skipping the Redis cases: {exc}", flush=True)
                continue
            extra["REDIS_URL"] = redis_url
        web, base_url = start_web(tmp, **extra)
        writer_env = base_env(**extra)
        try:
            for n in VIEWER_COUNTS:
                row = {"mode": mode, **latency_case(base_url, token, user, n, writer_env, tmp)}
                print(
                    f"{mode:5} viewers={n:3}  p50={row['p50']:7.1f} ms  p99={row['p99']:7.1f} ms  "
                    f"max={row['max']:7.1f} ms  ({row['frames']} frames)",
                    flush=True,
                )
                rows.append(row)
        finally:
            web.kill()
            if redis_proc is not None:
                redis_proc.kill()
    return rows


# ---------------------------------------------------------------------------- persistence
def persistence_benchmark() -> dict:
    from django.db import connections
    from django.test import override_settings

    from agentruns.models import RunEvent
    from agentruns.registry import Agent, ScriptedTurn, register_agent
    from agentruns.runtime.engine.executor import RunExecutor
    from agentruns.runtime.store import nudges
    from agentruns.services import start_run

    connections.close_all()  # a fresh connection after the long latency phase
    nudges.IN_WORKER_PROCESS = True  # as in qcluster: with the in-memory layer it skips nudges
    words = 4000
    register_agent(
        Agent(
            name="bench-persist",
            instructions="Talk.",
            scripted_policy=lambda messages: ScriptedTurn(text="word " * words),
        )
    )
    results = {}
    for label, flush_chars in (("one commit per token", 1), ("default batching (200 chars)", 200)):
        with override_settings(SCRIPTED_MODEL_DELAY_MS=0, AGENTRUNS_DELTA_FLUSH_CHARS=flush_chars):
            run = start_run("bench-persist", {"n": time.time()}).run
            started = time.perf_counter()
            RunExecutor(run.id).advance()
            elapsed = time.perf_counter() - started
        deltas = RunEvent.objects.filter(run=run, type="model.delta").count()
        results[label] = {
            "deltas": deltas,
            "seconds": elapsed,
            "per_second": deltas / elapsed,
            "chars_per_second": words * 5 / elapsed,
        }
        print(
            f"persist {label}: {deltas} delta events in {elapsed:.2f} s = {deltas / elapsed:,.0f}/s",
            flush=True,
        )
    return results


# ---------------------------------------------------------------------------- report
def markdown(rows: list[dict], persist: dict, load: tuple[float, float]) -> str:
    cpu = os.cpu_count()
    lines = [
        "## Streaming",
        "",
        "Event-commit-to-client latency of the run stream (`ws/runs/<id>/`), and how fast the engine",
        "persists model deltas. Measured by `benchmarks/stream_latency.py` (method in its docstring):",
        "",
        "```sh",
        COMMAND,
        "```",
        "",
        f"Machine: {cpu} cores, {platform.python_implementation()} {platform.python_version()}, "
        "PostgreSQL with fsync on, one daphne process; PostgreSQL, daphne, the writer and every "
        "viewer share the machine. "
        f"One `model.delta` commit every {WRITE_INTERVAL_S * 1000:.0f} ms, {EVENTS_PER_CASE} events "
        f"per case (the first {WARMUP_EVENTS} are warm-up, not measured); poll interval "
        f"{POLL_SECONDS * 1000:.0f} ms. 1-minute load average "
        f"{load[0]:.1f} before and {load[1]:.1f} after the run (other work on the machine shows up "
        "in these figures; compare runs at a similar load).",
        "",
        "| channel layer | viewers | p50 (ms) | p99 (ms) | max (ms) | frames measured | target p99 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        target = (
            "< 50 ms"
            if r["mode"] == "redis"
            else f"< {POLL_SECONDS * 1000 + 50:.0f} ms (poll + 50)"
        )
        name = "Redis (channels_redis)" if r["mode"] == "redis" else "in-memory + DB poll"
        lines.append(
            f"| {name} | {r['viewers']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | "
            f"{r['frames']} | {target} |"
        )
    lines += [
        "",
        "| delta persistence | delta events | seconds | events/s |",
        "|---|---:|---:|---:|",
    ]
    for label, r in persist.items():
        lines.append(f"| {label} | {r['deltas']} | {r['seconds']:.2f} | {r['per_second']:,.0f} |")
    lines += [
        "",
        "Why it is fast enough: all viewers of a run in one web process share one feed (one",
        "database read and one rendered, JSON-encoded frame per new event, fanned out to every",
        "socket), and the feed is the process's only channel-group member for the run, so a",
        "nudge costs one message per process, not one per viewer. Without Redis the feed polls",
        "the database once per interval per run per process, whatever the number of viewers.",
        "",
        "Contention matters on 2 cores. Observed while other test suites loaded this machine",
        "(1-minute load average about 6): Redis at 100 viewers p99 57-66 ms, the poll fallback at",
        "100 viewers p99 about 400 ms, delta persistence about 220 events/s. Nudges through Redis",
        "used to cost about 10 ms each on the committing thread (`async_to_sync` built a new loop",
        "and a new Redis connection per nudge); they now go out fire-and-forget on one long-lived",
        "loop per process (`nudges.send_nudge`), about 0.03 ms per nudge for the caller.",
        "",
    ]
    return "\n".join(lines)


def write_docs(section: str) -> None:
    """Replace only the `## Streaming` section of docs/BENCHMARKS.md (other sections belong to others)."""
    path = ROOT / "docs" / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(r"^## Streaming\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda m: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
    print(f"wrote the Streaming section of {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer", nargs=4, metavar=("RUN_ID", "COUNT", "INTERVAL", "OUT"))
    parser.add_argument("--write-docs", action="store_true", help="update docs/BENCHMARKS.md")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if args.writer:
        run_id, count, interval, out = args.writer
        writer_main(run_id, int(count), float(interval), out)
        return
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    setup_django()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="stream-bench-") as tmp:
        rows = [] if args.skip_latency else latency_benchmarks(Path(tmp))
        persist = persistence_benchmark()
    section = markdown(rows, persist, (load_before, os.getloadavg()[0]))
    print()
    print(section)
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
