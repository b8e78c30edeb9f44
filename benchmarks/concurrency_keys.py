"""Concurrency keys under load, side by side (issue 30; part of `make bench`).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.concurrency_keys \
        [--rounds 2] [--write-docs]

One real `qcluster` with its defaults (2 q2 worker processes, AGENTRUNS_RUNS_PER_PROCESS slots
each, claims from PostgreSQL), the seven-step refund flow of `benchmarks/workload.py` with every
model turn waiting TURN_MS. Three batches of 200 runs started together by 8 clients, interleaved
over rounds (a shared machine's load drifts):
- keyed, 20 orders: `bench-refund-keyed` (concurrency_key=order_id, concurrency=1), 10 runs per
  order: each order's runs must take turns;
- keyed, 200 orders: the same agent, one run per order: the key's cost without a line;
- no key, 200 orders: `bench-refund`, the flow as every other benchmark runs it.
While a batch runs, `benchmarks.sampling.KeySampler` reads, every 50 ms from a connection of its
own, how many runs of each order run (and hold the order) at once. Reported per batch: the wall
time (first start to last finish), its ratio to the keyed 200-order batch of the same round, how
long the 200 starts took, the median run, the serial bound of the 20-order batch (10 runs of an
order one after the other: 10 x its median run), the handoff
(one run's end to the next run of its order starting: the admission in the ending transaction,
the NOTIFY, a claimer's claim), the samples and the most runs of one order running and holding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import inflight, procs
from benchmarks.sampling import KeySampler, pct

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
os.environ.setdefault("LOG_LEVEL", "WARNING")

ROOT = Path(__file__).resolve().parent.parent
TURN_MS = 200
RUNS = 200
CLIENTS = 8
BATCHES = (
    ("keyed, 20 orders", "bench-refund-keyed", 20),
    ("keyed, 200 orders", "bench-refund-keyed", 200),
    ("no key, 200 orders", "bench-refund", 200),
)


def start_batch(agent: str, orders: int) -> tuple[list, float]:
    """RUNS runs of `agent` over `orders` orders (run i on order i mod orders), from CLIENTS
    threads at once; returns (ids, wall-clock start)."""
    from django.db import connection

    from agentruns.services import start_run

    def one(i: int):
        try:
            return start_run(agent, {"order_id": f"ORD-{1001 + i % orders}"}).run.id
        finally:
            connection.close()

    started = time.time()
    with ThreadPoolExecutor(CLIENTS) as clients:
        return list(clients.map(one, range(RUNS))), started


def handoffs_ms(ids: list) -> list[float]:
    """Per order, from one run's end to the start of the next run of the order."""
    from agentruns.models import Run

    by_order: dict[str, list] = {}
    for order, started, finished in Run.objects.filter(id__in=ids).values_list(
        "input__order_id", "started_at", "finished_at"
    ):
        by_order.setdefault(order, []).append((started, finished))
    gaps = []
    for runs in by_order.values():
        runs.sort()
        for (_, finished), (started, _) in zip(runs, runs[1:], strict=False):
            gaps.append((started - finished).total_seconds() * 1000)
    return gaps


def run_durations_s(ids: list) -> list[float]:
    from agentruns.models import Run

    rows = Run.objects.filter(id__in=ids).values_list("started_at", "finished_at")
    return [(finished - started).total_seconds() for started, finished in rows]


def measure(rounds: int) -> list[dict]:
    inflight.setup()
    proc = inflight.start_qcluster(SCRIPTED_MODEL_LATENCY_MS=TURN_MS)
    rows = []
    try:
        time.sleep(3)
        for agent in ("bench-refund", "bench-refund-keyed"):  # imports, pools, plans
            inflight.wait_done(inflight.start_together(8, agent)[0])
        for round_no in range(1, rounds + 1):
            for label, agent, orders in BATCHES:
                time.sleep(1)
                sampler = KeySampler(inflight.dsn(), agent, interval=0.05)
                sampler.start()
                ids, started = start_batch(agent, orders)
                starts = time.time() - started
                wall = inflight.wait_done(ids, timeout=600) - started
                sampler.stop()
                samples, running, holding = sampler.peaks()
                gaps = handoffs_ms(ids)
                row = {
                    "round": round_no,
                    "batch": label,
                    "orders": orders,
                    "wall_s": wall,
                    "starts_s": starts,
                    "run_p50_s": statistics.median(run_durations_s(ids)),
                    "handoff_p50_ms": pct(gaps, 50) if gaps else None,
                    "handoff_p90_ms": pct(gaps, 90) if gaps else None,
                    "samples": samples,
                    "most_running": running if agent.endswith("keyed") else None,
                    "most_holding": holding if agent.endswith("keyed") else None,
                }
                rows.append(row)
                print(f"  round {round_no} {label}: {wall:.2f} s, {row}", flush=True)
                if agent.endswith("keyed") and orders < RUNS:
                    assert running <= 1 and holding <= 1, f"{label}: two runs of one order"
    finally:
        procs.stop(proc)
    return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| round | batch | wall (s) | x keyed, 200 orders | 200 starts took (s) | run p50 (s) | "
        "serial bound (s) | handoff p50 / p90 (ms) | samples | most running / holding one order |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for row in rows:
        wide = next(
            r for r in rows if r["round"] == row["round"] and r["batch"] == "keyed, 200 orders"
        )
        per_order = RUNS // row["orders"]  # runs that must take turns: at least that many runs
        bound = per_order * row["run_p50_s"] if per_order > 1 else None
        handoff = (
            f"{row['handoff_p50_ms']:.0f} / {row['handoff_p90_ms']:.0f}"
            if row["handoff_p50_ms"] is not None
            else "-"
        )
        peaks = (
            f"{row['most_running']} / {row['most_holding']}"
            if row["most_running"] is not None
            else "-"
        )
        lines.append(
            f"| {row['round']} | {row['batch']} | {row['wall_s']:.2f} | "
            f"{row['wall_s'] / wide['wall_s']:.2f} | {row['starts_s']:.2f} | "
            f"{row['run_p50_s']:.2f} | {f'{bound:.1f}' if bound else '-'} | {handoff} | "
            f"{row['samples']} | {peaks} |"
        )
    return head + "\n".join(lines) + "\n"


def verdict(rows: list[dict]) -> str:
    """Issue 30's target, from this run's figures."""
    lined = [r for r in rows if r["batch"] == "keyed, 20 orders"]
    samples = sum(r["samples"] for r in lined)
    overlap = max((r["most_running"] for r in lined), default=None)
    held = max((r["most_holding"] for r in lined), default=None)
    met = bool(lined) and overlap == 1 and held == 1
    walls = ", ".join(
        f"{r['wall_s']:.1f} s against {w['wall_s']:.1f} s"
        for r in lined
        for w in rows
        if w["round"] == r["round"] and w["batch"] == "keyed, 200 orders"
    )
    return (
        f"Issue 30, 200 runs on 20 orders (10 each) with concurrency 1: never two running on one "
        f"order, all finish: **{'met' if met else 'not met'}** ({samples} samples, at most "
        f"{overlap} running and {held} holding an order; every run succeeded or the batch would "
        f"not have ended); wall {walls} for 200 runs on 200 orders.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1 if inflight.QUICK else 2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    rows = measure(args.rounds)
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "bench-concurrency-keys.json").write_text(json.dumps(rows))
    text = (
        f"{RUNS} runs of the seven-step flow per batch, every model turn {TURN_MS} ms, one "
        "`qcluster` with its defaults; the database sampled every 50 ms.\n\n"
        + markdown(rows)
        + "\n"
        + verdict(rows)
    )
    print(text)
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section("concurrency-keys", text)


if __name__ == "__main__":
    main()
