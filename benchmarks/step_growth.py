"""What the engine does per step as a run grows, counted, not timed: calls per step of every
function on every thread, and statements, parameter bytes and rows per step, for the runs of
`benchmarks.step_cost` (a short and a long `bench-long` run, ours and the bare loop).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.step_growth \
        [--calls 20,400] [--short-runs 10] [--slice-seconds 1000] [--top 30]

Timing the engine's own CPU per step (`step_cost`) subtracts two large figures measured on a
shared machine; counts have no noise. A profile function on every thread (`sys.setprofile` and
`threading.setprofile`, installed before the process's run loop starts, so the agent's loop is
counted as well as the lane) counts each Python function's calls and each builtin's, per thread,
then summed. The engine's own calls per step are ours minus the bare loop's (the loop's own
growth, every request carrying the whole history, is the same on both sides); a function whose
own calls per step grow from the short run to the long one is work that grows with the run.
Statements are counted at psycopg's cursor (Django's and the store's kept cursors alike).

`--slice-seconds`: the default (1000) keeps each run in one slice, so what is left is per step.
With `step_cost`'s 5 s the long run is resumed many times (the profile function slows it), and
what each resumed slice pays for the run's history shows up too (its steps loaded, its messages
validated and dumped).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
from collections import Counter
from typing import Any

from benchmarks import step_cost

_local = threading.local()
_all_threads: list[Counter] = []  # each thread's counts (appended once per thread)
_counting = False


def _counts() -> Counter:
    counts = getattr(_local, "counts", None)
    if counts is None:
        counts = _local.counts = Counter()
        _all_threads.append(counts)
    return counts


def _profile(frame: Any, event: str, arg: Any) -> None:
    if not _counting:
        return
    if event == "call":
        _counts()[frame.f_code] += 1
    elif event == "c_call":  # by name: a bound builtin would keep its instance alive
        qualname = getattr(arg, "__qualname__", "?")
        if "." not in qualname:  # a module's function
            qualname = f"{getattr(arg, '__module__', None) or '?'}.{qualname}"
        _counts()["(builtin) " + qualname] += 1


def _name(key: Any) -> str:
    if hasattr(key, "co_filename"):
        path = re.sub(r".*/site-packages/", "", key.co_filename).replace(os.getcwd() + "/", "")
        return f"{path}:{key.co_firstlineno} {key.co_qualname}"
    return str(key)


class Statements:
    """Statements, parameter bytes and rows fetched, per statement's shape, at psycopg's cursor."""

    def __init__(self) -> None:
        import psycopg

        self.count: Counter = Counter()
        self.bytes: Counter = Counter()
        self.rows: Counter = Counter()
        execute = psycopg.Cursor.execute  # (ClientCursor inherits it)
        seen = self

        def counted(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            out = execute(cursor, query, params, **kwargs)
            if _counting:
                shape = re.sub(r"\s+", " ", query if isinstance(query, str) else str(query))
                shape = re.sub(r"SAVEPOINT \S+", "SAVEPOINT x", shape)[:100]
                seen.count[shape] += 1
                seen.bytes[shape] += _size(params)
                if cursor.description is not None:
                    seen.rows[shape] += max(cursor.rowcount, 0)
            return out

        psycopg.Cursor.execute = counted  # type: ignore[method-assign]

    def take(self) -> dict[str, Counter]:
        taken = {"count": self.count, "bytes": self.bytes, "rows": self.rows}
        self.count, self.bytes, self.rows = Counter(), Counter(), Counter()
        return taken


def _size(params: Any) -> int:
    if params is None:
        return 0
    if isinstance(params, list | tuple):
        return sum(_size(p) for p in params)
    if isinstance(params, dict):
        return sum(_size(p) for p in params.values())
    return len(params) if isinstance(params, str | bytes) else 8


def counted(system: Any, calls: int, runs: int, statements: Statements) -> dict:
    """Calls and statements of `runs` runs of `calls` calls, and their steps and slices."""
    global _counting
    for counts in _all_threads:
        counts.clear()
    statements.take()
    steps = slices = 0
    _counting = True
    try:
        for _ in range(runs):
            got = system(calls)
            steps, slices = steps + got["steps"], slices + got.get("slices", 0)
    finally:
        _counting = False
    total: Counter = Counter()
    for counts in _all_threads:
        total.update(counts)
    return {"steps": steps, "slices": slices, "calls": total, "sql": statements.take()}


def report(short: dict, long: dict, bare_short: dict, bare_long: dict, top: int) -> None:
    def per_step(seen: dict, key: Any) -> float:
        return seen["calls"].get(key, 0) / seen["steps"]

    print(
        f"slices: ours {short['slices']} over {short['steps']} steps (short), "
        f"{long['slices']} over {long['steps']} steps (long)"
    )
    keys = set(short["calls"]) | set(long["calls"]) | set(bare_short["calls"])
    keys |= set(bare_long["calls"])
    rows = []
    for key in keys:
        at_short = per_step(short, key) - per_step(bare_short, key)
        at_long = per_step(long, key) - per_step(bare_long, key)
        rows.append((at_long - at_short, at_short, at_long, _name(key)))
    rows.sort(key=lambda row: -abs(row[0]))
    for label, seen, bare in (("short", short, bare_short), ("long", long, bare_long)):
        ours_calls = sum(seen["calls"].values()) / seen["steps"]
        bare_calls = sum(bare["calls"].values()) / bare["steps"]
        print(
            f"calls per step, {label} run: ours {ours_calls:.0f}, bare {bare_calls:.0f}, "
            f"engine's own {ours_calls - bare_calls:.0f}"
        )
    print(
        f"\nthe engine's own calls per step (ours - bare), short -> long, the {top} that move most:"
    )
    for growth, at_short, at_long, name in rows[:top]:
        print(f"{growth:+10.2f} {at_short:10.2f} -> {at_long:10.2f}  {name}")
    print("\nstatements per step (ours), short -> long: count | parameter bytes | rows")
    shapes = set(short["sql"]["count"]) | set(long["sql"]["count"])
    for shape in sorted(shapes, key=lambda s: -long["sql"]["bytes"].get(s, 0)):
        cells = [
            f"{short['sql'][what].get(shape, 0) / short['steps']:.3f} -> "
            f"{long['sql'][what].get(shape, 0) / long['steps']:.3f}"
            for what in ("count", "bytes", "rows")
        ]
        print(f"{cells[0]:>17} | {cells[1]:>19} | {cells[2]:>15} | {shape}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="20,400", help="tool calls of the short and long run")
    parser.add_argument("--short-runs", type=int, default=10, help="runs of the short length")
    parser.add_argument("--slice-seconds", type=float, default=1000.0)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    short_calls, long_calls = sorted(int(n) for n in args.calls.split(","))
    step_cost.setup(args.slice_seconds)
    # before any thread of the runs starts (the process's run loop starts with the first run)
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    statements = Statements()
    bare = step_cost.BareLoop(os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1))

    def ours(calls: int) -> dict:
        return step_cost.ours(calls, budget_s=3600)

    try:
        for _ in range(2):  # warm up both: imports, plans, caches
            ours(short_calls)
            bare.run(short_calls)
        seen = [
            counted(ours, short_calls, args.short_runs, statements),
            counted(ours, long_calls, 1, statements),
            counted(bare.run, short_calls, args.short_runs, statements),
            counted(bare.run, long_calls, 1, statements),
        ]
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        bare.close()
    report(*seen, top=args.top)


if __name__ == "__main__":
    main()
