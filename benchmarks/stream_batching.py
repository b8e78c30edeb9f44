"""Streaming at scale (issue 22 item 4): many runs streaming tokens through one real worker.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.stream_batching \
        [--checkout /path/to/other/checkout] [--runs 200] [--token-ms 20] [--tokens 60]

N runs of a two-turn agent whose scripted model streams `--tokens` tokens per turn, one every
`--token-ms` (20 ms: 50 tokens a second, a realistic rate), started together by 8 clients and
carried by one `qcluster` of `--checkout` (default: this one) with its defaults. Reports the
wall time, the model.delta events and the commits that wrote them (a statement stamps all its
events with one time, so distinct stamps are commits), the server's transactions
(pg_stat_database), and start to first delta per run as the database saw it (`run.created` to
the first `model.delta`, p50/p95), and the worker's CPU per run (every process of the qcluster's
process group). Runs are started by this checkout's code; the worker is the checkout's, so the
same command against an older checkout is the before/after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")
AGENT_MODULE = "bench_stream_agent"
# a module of its own (not under benchmarks/) so an older checkout's worker imports it too
AGENT_SOURCE = """
import json
from agentruns.registry import Agent, ScriptedTurn, register_agent, tool


@tool(name="bench_stream_lookup")
def bench_stream_lookup(ctx, order_id: str) -> dict:
    return {"order_id": order_id}


def stream_policy(messages):
    tokens = int(json.loads(messages[1]["content"]).get("tokens", 60))
    text = " ".join(f"word{i}" for i in range(tokens))
    if sum(1 for m in messages if m["role"] == "assistant") == 0:
        return ScriptedTurn(text, [("bench_stream_lookup", {"order_id": "ORD-1001"})])
    return ScriptedTurn(text)


register_agent(
    Agent(
        name="bench-stream",
        instructions="Talk.",
        tools=["bench_stream_lookup"],
        scripted_policy=stream_policy,
    )
)
"""
CLIENTS = 8


def group_cpu(pgid: int) -> float:
    """CPU seconds of process group `pgid`: its live processes' and the children they reaped."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid:
            ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--token-ms", type=float, default=20)
    parser.add_argument("--tokens", type=int, default=60)
    args = parser.parse_args()
    agent_dir = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    (agent_dir / f"{AGENT_MODULE}.py").write_text(AGENT_SOURCE)
    sys.path.insert(0, str(agent_dir))
    os.environ["AGENTRUNS_AGENT_MODULES"] = AGENT_MODULE
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from agentruns.models import Run, RunEvent
    from agentruns.services import start_run
    from benchmarks import procs

    call_command("migrate", verbosity=0)
    env = {
        **os.environ,
        "PYTHONPATH": f"{agent_dir}:{os.environ.get('PYTHONPATH', '')}",
        "SCRIPTED_MODEL_DELAY_MS": str(args.token_ms),
        "AGENTRUNS_AGENT_MODULES": AGENT_MODULE,
    }
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=args.checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def start_all(n: int) -> list:
        def one(_: int):
            try:
                return start_run("bench-stream", {"tokens": args.tokens}).run.id
            finally:
                connection.close()

        with ThreadPoolExecutor(CLIENTS) as clients:
            return list(clients.map(one, range(n)))

    def wait(ids: list) -> None:
        deadline = time.monotonic() + 600
        while Run.objects.filter(id__in=ids, status="succeeded").count() < len(ids):
            if time.monotonic() > deadline:
                raise TimeoutError("the streaming batch did not finish")
            time.sleep(0.1)

    def transactions() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            return cursor.fetchone()[0]

    try:
        time.sleep(3)
        wait(start_all(8))  # warm-up: imports, pools, plans
        time.sleep(1)
        before, started, cpu = transactions(), time.monotonic(), group_cpu(worker.pid)
        ids = start_all(args.runs)
        wait(ids)
        wall, xacts = time.monotonic() - started, transactions() - before
        cpu = group_cpu(worker.pid) - cpu
    finally:
        procs.stop(worker)
    deltas = RunEvent.objects.filter(run_id__in=ids, type="model.delta")
    stamps = set(deltas.values_list("created_at", flat=True))
    first: dict = {}
    created: dict = {}
    for run_id, etype, at in (
        RunEvent.objects.filter(run_id__in=ids, type__in=["run.created", "model.delta"])
        .order_by("seq")
        .values_list("run_id", "type", "created_at")
    ):
        if etype == "run.created":
            created[run_id] = at
        else:
            first.setdefault(run_id, at)
    latencies = sorted((first[r] - created[r]).total_seconds() * 1000 for r in first)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    print(
        f"checkout {args.checkout}: {args.runs} runs x 2 turns x {args.tokens} tokens every "
        f"{args.token_ms:g} ms\n"
        f"  wall {wall:.2f} s ({args.runs / wall:.1f} runs/s)\n"
        f"  model.delta events {deltas.count()}, written by {len(stamps)} commits "
        f"({deltas.count() / max(1, len(stamps)):.1f} events per commit)\n"
        f"  server transactions {xacts} ({xacts / wall:.0f}/s)\n"
        f"  worker CPU {cpu:.2f} s ({cpu * 1000 / args.runs:.1f} ms per run)\n"
        f"  start to first delta (database clock) p50 {statistics.median(latencies):.0f} ms, "
        f"p95 {p95:.0f} ms"
    )


if __name__ == "__main__":
    main()
