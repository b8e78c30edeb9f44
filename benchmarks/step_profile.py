"""Where the in-process engine's CPU per step goes, by module group (cProfile's own time).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.step_profile \
        [--runs 200] [--top 25]

Runs `--runs` refund runs of bench-refund with `execute_inline` (zero model latency, seven
steps a run) under cProfile after a warm-up, and prints each group's share of the profiled own
time and its CPU ms per step (the profiler's overhead inflates every figure alike: read the
shares; `benchmarks.ab_engine` gives the unprofiled CPU per run), then the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections import Counter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SCRIPTED_MODEL_DELAY_MS", "0")
os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from agentruns.services import execute_inline  # noqa: E402

STEPS_PER_RUN = 7
# the first match wins: a path containing the marker belongs to the group
GROUPS = (
    ("our durability capability and units", "agentruns/runtime/engine/"),
    ("our store and writer (rows, events)", "agentruns/runtime/store/"),
    ("our store and writer (rows, events)", "agentruns/runtime/writer"),
    ("our scripted model", "agentruns/runtime/providers/"),
    ("our other code", "agentruns/"),
    ("our other code", "support/"),
    ("the workload's tools", "benchmarks/"),
    ("pydantic-ai durable_exec", "pydantic_ai/durable_exec/"),
    ("pydantic-ai agent graph and tools", "pydantic_ai/"),
    ("pydantic-ai agent graph and tools", "pydantic_graph/"),
    ("pydantic / pydantic-core (validation, JSON)", "pydantic/"),
    ("pydantic / pydantic-core (validation, JSON)", "pydantic_core/"),
    ("Django ORM and transactions", "django/"),
    ("psycopg (the driver)", "psycopg"),
    ("json (stdlib)", "json/"),
    ("asyncio and contextvars", "asyncio/"),
    ("anyio / sniffio (task groups of the graph)", "anyio/"),
    ("anyio / sniffio (task groups of the graph)", "sniffio/"),
    ("dataclasses.replace / copy (RunContext copies)", "dataclasses.py"),
    ("dataclasses.replace / copy (RunContext copies)", "/copy.py"),
    ("OpenTelemetry / logfire", "opentelemetry"),
    ("OpenTelemetry / logfire", "logfire"),
)


def group_of(filename: str) -> str:
    for name, marker in GROUPS:
        if marker in filename:
            return name
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (C: copy, dataclasses, isinstance, ...)"
    return "other stdlib / libraries"


# own time that belongs to whoever called it: builtins, dataclasses.replace, copy, typing, ...
ATTRIBUTED = {
    "builtins (C: copy, dataclasses, isinstance, ...)",
    "dataclasses.replace / copy (RunContext copies)",
    "other stdlib / libraries",
}


def by_owner(stats: pstats.Stats) -> Counter:
    """Own CPU per group, a builtin's or a stdlib helper's given to its callers' groups (in
    proportion to the time each caller spent in it, through up to eight such helpers)."""
    table = stats.stats  # type: ignore[attr-defined]
    memo: dict = {}

    def shares(func: tuple, depth: int) -> Counter:
        if func in memo:
            return memo[func]
        group = group_of(func[0])
        callers = table.get(func, (0, 0, 0, 0, {}))[4]
        spent = sum(v[2] for v in callers.values())
        if group not in ATTRIBUTED or depth > 8 or not spent:
            found = Counter({group: 1.0})
        else:
            found = Counter()
            for caller, v in callers.items():
                for name, part in shares(caller, depth + 1).items():
                    found[name] += part * v[2] / spent
        memo[func] = found
        return found

    owners: Counter = Counter()
    for func, (_, _, tottime, _, _) in table.items():
        for name, part in shares(func, 0).items():
            owners[name] += tottime * part
    return owners


def run(count: int) -> None:
    for i in range(count):
        _, outcome = execute_inline("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"})
        assert outcome == "succeeded", outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", default="", help="also dump the profile here (pstats)")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    run(20)  # warm-up
    cpu = time.process_time()
    run(args.runs)
    plain_ms = (time.process_time() - cpu) * 1000 / args.runs / STEPS_PER_RUN
    profiler = cProfile.Profile(time.process_time)  # CPU, not the waits on PostgreSQL
    profiler.enable()
    run(args.runs)
    profiler.disable()
    stats = pstats.Stats(profiler)
    if args.save:
        stats.dump_stats(args.save)
    by_group: Counter = Counter()
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_group[group_of(filename)] += tottime
    total = sum(by_group.values())
    steps = args.runs * STEPS_PER_RUN
    print(f"unprofiled CPU per step: {plain_ms:.3f} ms ({plain_ms * STEPS_PER_RUN:.2f} ms a run)")
    print(f"profiled own CPU per step: {total * 1000 / steps:.3f} ms\n")
    for title, groups in (("own time", by_group), ("helpers given to callers", by_owner(stats))):
        print(f"{title:48} {'share':>6} {'ms/step (unprofiled, by share)':>32}")
        for name, seconds in groups.most_common():
            share = seconds / total
            print(f"{name:48} {share:6.1%} {share * plain_ms:32.3f}")
        print()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
