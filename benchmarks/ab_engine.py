"""A/B of the in-process engine between two checkouts of this repository, alternating rounds.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.ab_engine \
        --a /path/to/old-checkout --b . --runs 150 --rounds 7

`--b-env NAME=VALUE` (repeatable) sets a variable for B's processes only: the same checkout
with and without tracing is `--a . --b . --b-env OTEL_EXPORTER_OTLP_ENDPOINT=http://...`.

Each round runs `--runs` refund runs with `execute_inline` (created leased, executed in the
process, zero model latency) in a fresh process of each checkout, each on its own database of
the same PostgreSQL server; A and B alternate so machine noise hits both alike. Prints the
runs/s of every round and the median ratio B/A, and the CPU time per run of the engine's
process (all its threads, so a tracing exporter's too; less sensitive to a loaded machine than
wall time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from benchmarks.procs import python_for

CHILD = r"""
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("seed_demo", stdout=open(os.devnull, "w"))
try:
    from agentruns.services import execute_inline
except ImportError:  # checkouts before the layout change
    from agentruns.engine import execute_inline
runs = int(sys.argv[1])
for i in range(10):  # warm-up
    execute_inline("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"})
started, cpu = time.perf_counter(), time.process_time()
for i in range(runs):
    _, outcome = execute_inline("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"})
    assert outcome == "succeeded", outcome
rate, cpu_ms = runs / (time.perf_counter() - started), (time.process_time() - cpu) * 1000 / runs
print(rate, cpu_ms)
"""


def database_url(base: str, name: str) -> str:
    parsed = urlparse(base)
    return urlunparse(parsed._replace(path="/" + name))


def create_database(base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")


def one_round(checkout: Path, url: str, runs: int, extra: dict[str, str]) -> tuple[float, float]:
    """(runs/s, CPU ms per run of the engine's process: all its threads, the database's not)."""
    env = {
        **os.environ,
        **extra,
        "DATABASE_URL": url,
        "SCRIPTED_MODEL_DELAY_MS": "0",
        "AGENTRUNS_AGENT_MODULES": "benchmarks.workload",
        "LOG_LEVEL": "WARNING",
    }
    out = subprocess.run(
        [python_for(checkout), "-c", CHILD, str(runs)],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rate, cpu_ms = out.stdout.strip().splitlines()[-1].split()
    return float(rate), float(cpu_ms)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", required=True, type=Path)
    parser.add_argument("--b", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    extra = {"a": {}, "b": dict(item.split("=", 1) for item in args.b_env)}
    base = os.environ["DATABASE_URL"]
    urls = {}
    for side in ("a", "b"):
        create_database(base, f"ab_{side}")
        urls[side] = database_url(base, f"ab_{side}")
    rates: dict[str, list[float]] = {"a": [], "b": []}
    cpu: dict[str, list[float]] = {"a": [], "b": []}
    for round_no in range(args.rounds):
        order = ("a", "b") if round_no % 2 == 0 else ("b", "a")
        for side in order:
            rate, cpu_ms = one_round(getattr(args, side), urls[side], args.runs, extra[side])
            rates[side].append(rate)
            cpu[side].append(cpu_ms)
        print(
            f"round {round_no + 1}: A {rates['a'][-1]:.1f} runs/s {cpu['a'][-1]:.2f} CPU ms/run, "
            f"B {rates['b'][-1]:.1f} runs/s {cpu['b'][-1]:.2f} CPU ms/run",
            flush=True,
        )
    a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
    ratios = [y / x for x, y in zip(rates["a"], rates["b"], strict=True)]
    print(
        f"median A {a:.1f} runs/s, B {b:.1f} runs/s; B/A {b / a:.3f} "
        f"(per-round ratios {min(ratios):.2f}..{max(ratios):.2f})"
    )
    ca, cb = statistics.median(cpu["a"]), statistics.median(cpu["b"])
    print(
        f"median CPU per run (the engine's process, all threads): A {ca:.2f} ms, B {cb:.2f} ms; "
        f"B-A {cb - ca:+.2f} ms"
    )


if __name__ == "__main__":
    main()
