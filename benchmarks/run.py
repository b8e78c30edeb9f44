"""`make bench`: the engine side by side with the floor, DBOS Transact, the same Pydantic AI
agent with no durability and on DBOSDurability (benchmarks/peers_agent.py) and LangGraph.

Everything runs in one process on one throwaway PostgreSQL (fsync on), in interleaved rounds so
machine noise hits every system alike; we report medians over rounds and the ratios.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.run [--quick]

`--side-by-side-only` runs the in-process rounds alone (no queue, run length or recovery),
prints them and writes var/bench-engine-side.json (not the docs, not var/bench-engine.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SCRIPTED_MODEL_DELAY_MS", "0")
os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from agentruns.models import Run, StepAttempt  # noqa: E402
from agentruns.runtime.engine.executor import RunExecutor  # noqa: E402
from agentruns.services import execute_inline, start_run  # noqa: E402
from benchmarks.docs import write_marked_section  # noqa: E402
from benchmarks.procs import start_qcluster, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STEPS_PER_RUN = 7


def dsn() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgresql://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{s['NAME']}"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Ours:
    name = "ours (engine in-process)"

    def run(self, order_id: str) -> None:
        # created already leased by this process and executed here, like the peers' in-process runs
        _, outcome = execute_inline("bench-refund", {"order_id": order_id})
        assert outcome == "succeeded"

    def close(self) -> None:
        pass


def measure(system, runs: int, offset: int) -> list[float]:
    latencies = []
    for i in range(runs):
        started = time.perf_counter()
        system.run(f"ORD-{1001 + (offset + i) % 50}")
        latencies.append(time.perf_counter() - started)
    return latencies


def side_by_side(runs: int, rounds: int) -> dict[str, dict]:
    from benchmarks.peers import DBOSPeer, Floor, LangGraphAsyncPeer, LangGraphPeer
    from benchmarks.peers_agent import BareAgentPeer, DBOSAgentPeer

    systems = [Floor(dsn()), Ours()]
    for peer in (BareAgentPeer, DBOSPeer, DBOSAgentPeer, LangGraphPeer, LangGraphAsyncPeer):
        try:
            systems.append(peer(dsn()))
        except Exception as exc:  # an optional extra that is missing must not sink the rest
            print(f"  skipping {peer.name}: {exc!r}", file=sys.stderr)
    for system in systems:  # warm up: connections, caches, JIT-less imports
        measure(system, 10, 0)
    per_round: dict[str, list[float]] = {s.name: [] for s in systems}
    latencies: dict[str, list[float]] = {s.name: [] for s in systems}
    # CPU of this process per run (all its threads: a peer's background ones too)
    cpu: dict[str, list[float]] = {s.name: [] for s in systems}
    for r in range(rounds):
        for system in systems:
            started = time.process_time()
            lat = measure(system, runs, r * runs)
            cpu[system.name].append((time.process_time() - started) * 1000 / runs)
            per_round[system.name].append(runs / sum(lat))
            latencies[system.name].extend(lat)
        if (r + 1) % max(1, rounds // 5) == 0:
            print(
                f"  round {r + 1}/{rounds}: "
                + ", ".join(
                    f"{n.split(' (')[0]} {statistics.median(v):.0f}/s" for n, v in per_round.items()
                ),
                file=sys.stderr,
            )
    for system in systems:
        system.close()
    return {
        name: {
            "runs_per_s": statistics.median(per_round[name]),
            "steps_per_s": statistics.median(per_round[name]) * STEPS_PER_RUN,
            "p50_ms": pct(latencies[name], 50) * 1000,
            "p99_ms": pct(latencies[name], 99) * 1000,
            "cpu_ms_per_run": statistics.median(cpu[name]),
        }
        for name in per_round
    }


def _worker(**env: object) -> subprocess.Popen:
    return start_qcluster(dsn().replace("postgresql://", "postgres://"), **env)


def through_queue(runs: int) -> dict:
    """End to end: POST-equivalent start_run (enqueues) -> django-q2 with 2 workers -> done."""
    worker = _worker(Q_WORKERS=2, Q_POLL=0.05, AGENTRUNS_LEASE_TTL_SECONDS=15)
    time.sleep(3)
    try:
        started = time.perf_counter()
        ids = [
            start_run("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"}).run.id
            for i in range(runs)
        ]
        deadline = time.monotonic() + 300
        while Run.objects.filter(id__in=ids, status="succeeded").count() < runs:
            if time.monotonic() > deadline:
                raise TimeoutError("queue benchmark did not finish")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
    finally:
        stop(worker)
    lat = [(r.finished_at - r.created_at).total_seconds() for r in Run.objects.filter(id__in=ids)]
    return {
        "runs_per_s": runs / elapsed,
        "steps_per_s": runs * STEPS_PER_RUN / elapsed,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
    }


def run_length(lengths=(10, 100, 1000)) -> list[dict]:
    rows = []
    for steps in lengths:
        count = max(1, 300 // steps)
        times, slices = [], []
        for _ in range(count):
            run = start_run("bench-long", {"steps": steps}, enqueue_task=False).run
            t = time.perf_counter()
            # claimed through the queue path; a long run yields at its time slice (and its next
            # slice replays the agent's loop up to where it stopped)
            outcome, taken = "queued", 0
            while outcome == "queued" and taken < 1000:
                outcome, taken = RunExecutor(run.id).advance(), taken + 1
            assert outcome == "succeeded", outcome
            times.append(time.perf_counter() - t)
            slices.append(taken)
            actual = Run.objects.get(id=run.id).step_count
        per_step_ms = statistics.median(times) / actual * 1000
        # the last 10% of steps of the longest run: does a step get slower as history grows?
        rows.append(
            {
                "steps": actual,
                "runs": count,
                "run_ms": statistics.median(times) * 1000,
                "per_step_ms": per_step_ms,
                "slices": statistics.median(slices),
            }
        )
        print(
            f"  {actual} steps/run: {per_step_ms:.3f} ms per step, "
            f"{statistics.median(slices):g} slices",
            file=sys.stderr,
        )
    return rows


def recovery(kills: int) -> dict:
    """SIGKILL the worker process executing a step; time until the step's next attempt starts."""
    ttl, sweep = 2.0, 0.5
    worker = _worker(
        Q_WORKERS=1,
        Q_POLL=0.05,
        AGENTRUNS_LEASE_TTL_SECONDS=ttl,
        AGENTRUNS_SWEEP_INTERVAL_SECONDS=sweep,
        BENCH_SLOW_TOOL_SECONDS=30,
    )
    time.sleep(3)
    samples = []
    try:
        for _ in range(kills):
            run = start_run("bench-slow", {}).run
            deadline = time.monotonic() + 60
            attempt = None
            while attempt is None and time.monotonic() < deadline:
                attempt = StepAttempt.objects.filter(
                    step__run=run, step__tool="bench_sleep", number=1
                ).first()
                time.sleep(0.02)
            owner = Run.objects.get(id=run.id).lease_owner
            pid = int(owner.split(":")[1])
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            second = None
            while second is None and time.monotonic() < deadline:
                second = StepAttempt.objects.filter(
                    step__run=run, step__tool="bench_sleep", number=2
                ).first()
                time.sleep(0.02)
            if second is None:
                raise TimeoutError("the run did not continue after the kill")
            samples.append(second.started_at.timestamp() - killed)
            Run.objects.filter(id=run.id).update(cancel_requested=True)
    finally:
        stop(worker)
    return {
        "kills": kills,
        "p50_s": pct(samples, 50),
        "p99_s": pct(samples, 99),
        "max_s": max(samples),
        "lease_ttl_s": ttl,
        "sweep_s": sweep,
        "bound_s": ttl + sweep + 1,
    }


def chart(results: dict, lengths: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(results)
    colours = [
        "#2b6cb0" if n.startswith("ours") else "#718096" if n.startswith("floor") else "#b7791f"
        for n in names
    ]
    a.barh(names, [results[n]["runs_per_s"] for n in names], color=colours)
    a.set_xlabel("runs/s (7 durable steps per run)")
    a.set_title("Throughput, side by side")
    b.plot([r["steps"] for r in lengths], [r["per_step_ms"] for r in lengths], marker="o")
    b.set_xscale("log")
    b.set_ylim(bottom=0)
    b.set_xlabel("steps per run")
    b.set_ylabel("ms per step")
    b.set_title("Per-step cost vs run length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ratios_of(results: dict) -> dict[str, float]:
    ours = results["ours (engine in-process)"]["runs_per_s"]
    ratios = {"ours/floor": ours / results["floor (raw psycopg)"]["runs_per_s"]}
    for peer, key in (
        ("Pydantic AI agent, no durability", "ours/no durability"),
        ("DBOS Transact", "ours/DBOS"),
        ("Pydantic AI agent + DBOSDurability", "ours/DBOSDurability agent"),
        ("LangGraph + PostgresSaver", "ours/LangGraph"),
    ):
        if peer in results:
            ratios[key] = ours / results[peer]["runs_per_s"]
    return ratios


def side_by_side_only(runs: int, rounds: int) -> None:
    results = side_by_side(runs, rounds)
    ratios = ratios_of(results)
    for name, r in results.items():
        print(
            f"{name:52} {r['runs_per_s']:7.1f} runs/s  p50 {r['p50_ms']:6.2f} ms  "
            f"CPU {r['cpu_ms_per_run']:6.2f} ms/run"
        )
    print(", ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "bench-engine-side.json").write_text(
        json.dumps({"results": results, "ratios": ratios, "runs": runs, "rounds": rounds}, indent=2)
    )


def write_docs(section: str) -> None:
    write_marked_section("engine", section)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="fewer runs (a smoke test of the harness)"
    )
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--side-by-side-only", action="store_true")
    parser.add_argument("--runs", type=int, default=0, help="runs per round (0: the default)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (0: the default)")
    args = parser.parse_args()
    args.quick = args.quick or bool(os.environ.get("BENCH_QUICK"))
    # rounds long enough for each system to run warm (10-run rounds measured every system
    # slower, ours most: caches go cold when four systems take turns every few milliseconds)
    runs, rounds, kills = (30, 2, 3) if args.quick else (150, 7, 20)
    runs, rounds = args.runs or runs, args.rounds or rounds

    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    print("side by side (in-process, sequential):", file=sys.stderr)
    if args.side_by_side_only:
        side_by_side_only(runs, rounds)
        return
    results = side_by_side(runs, rounds)
    print("through django-q2 (2 workers):", file=sys.stderr)
    results["ours (through django-q2, 2 workers)"] = through_queue(60 if args.quick else 300)
    print("run length:", file=sys.stderr)
    lengths = run_length()
    print("recovery after SIGKILL:", file=sys.stderr)
    rec = recovery(kills)

    ratios = ratios_of(results)
    lines = [
        "| system | runs/s | steps/s | p50 run (ms) | p99 run (ms) | CPU per run, this process (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        cpu = f"{r['cpu_ms_per_run']:.2f}" if "cpu_ms_per_run" in r else "-"
        lines.append(
            f"| {name} | {r['runs_per_s']:.1f} | {r['steps_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {cpu} |"
        )
    table = "\n".join(lines)
    ratio_text = ", ".join(f"**{k} = {v:.2f}**" for k, v in ratios.items())
    length_lines = [
        "| steps per run | runs | median run (ms) | ms per step |",
        "|---:|---:|---:|---:|",
    ]
    length_lines += [
        f"| {r['steps']} | {r['runs']} | {r['run_ms']:.1f} | {r['per_step_ms']:.3f} |"
        for r in lengths
    ]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL (fsync on, local socket over TCP loopback)"
    print("\n" + table + "\n\nratios: " + ratio_text)
    print("\n".join(length_lines))
    print(json.dumps(rec))
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "bench-engine.json").write_text(
        json.dumps(
            {"results": results, "ratios": ratios, "lengths": lengths, "recovery": rec}, indent=2
        )
    )
    if args.no_docs:
        return
    chart(results, lengths, ROOT / "docs" / "benchmarks.png")
    write_docs(
        "## Engine: durable steps side by side\n\n"
        'Command: `make bench` (= `PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.run`).\n'
        f"Machine: {machine}. Workload: the refund flow as seven durable steps "
        "(model, lookup, model, refund to the gateway ledger in the same database, model, reply, model), "
        "scripted model with no delay, runs executed one after another, "
        f"{rounds} interleaved rounds of {runs} runs per system (medians). "
        "Ours in-process: `services.execute_inline` (the run is created already leased and executed in "
        'this process). "Pydantic AI agent, no durability" is the same agent as ours (the same model '
        "function, the same three tools running the same statements) run with plain `agent.run()` "
        "and nothing persisted but what its tools write: the framework's floor for this flow "
        '(benchmarks/peers_agent.py); "floor (raw psycopg)" is the database\'s, one committed row per '
        "step and no agent loop. Every step of every durable system is persisted before the next one starts: LangGraph "
        'runs with `durability="sync"`; its default, `"async"`, persists a checkpoint while the next '
        "step already runs and is shown for reference only. The queue row is end to end: "
        "its latency includes waiting in the queue (all runs are enqueued at once for 2 workers).\n\n"
        f"{table}\n\nRatios: {ratio_text}.\n\n"
        "### Per-step cost vs run length\n\n" + "\n".join(length_lines) + "\n\n"
        "### Recovery after SIGKILL\n\n"
        f"The worker process executing a step is SIGKILLed {rec['kills']} times; the time until the step's "
        f"next attempt starts: p50 {rec['p50_s']:.2f} s, p99 {rec['p99_s']:.2f} s, max {rec['max_s']:.2f} s "
        f"(lease TTL {rec['lease_ttl_s']} s + sweep interval {rec['sweep_s']} s + 1 s = {rec['bound_s']} s bound).\n\n"
        "![throughput and per-step cost](benchmarks.png)\n"
    )


if __name__ == "__main__":
    main()
