"""The engine's own CPU per step as a run grows: runs of 20 and of 400 read-only tool calls, with
the bare agent loop's own cost for the same run taken off (issue 43, item 2; part of `make bench`).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.step_cost \
        [--quick] [--calls 20,400] [--rounds 3] [--slice-seconds 1] [--write-docs]

The run: `bench-long` (benchmarks/workload.py, `long_policy`): one `bench_lookup` call (a
SELECT of an order's amount) per model turn until it has made `--calls` calls, then "Done.": a
run of N calls is N tool steps and N + 1 model steps. The scripted model answers at once, so
the run is CPU and database round trips only.

- ours: in this process, as `benchmarks.run` runs the engine: `execute_inline` for the run's
  first slice, then `RunExecutor.advance()` for each slice after the run yielded (as a worker
  claims a queued run again), until it succeeded; the slices are counted. A slice yields after
  AGENTRUNS_SLICE_SECONDS, here `--slice-seconds` (5 s: a long run is resumed several times,
  and what a resumed slice pays for the run's history is what this measures; the deployment's
  default slice is Q_TIMEOUT / 2, 60 s, of wall time shared with every run of its process, so
  under a batch a run's slice covers a few seconds of its own work). A run still unfinished after `--budget-seconds` is reported
  as such (an engine whose resumed slices replay the history from the start can end up making
  a step a slice) and its length is not run again;
- the bare loop: the same Pydantic AI agent (its instructions, the same tool running the same
  statement on a psycopg connection), the same model function (the process's scripted model
  playing `long_policy`), plain `agent.run()` with no capability and no usage limit, in this
  process. Its cost per step grows with the run too (every request carries the whole history):
  that growth is the loop's, not the engine's.

The figure: CPU time of this process (`time.process_time`: all its threads; PostgreSQL's
processes are not counted) per run. The engine's own CPU per step = (ours - bare) / steps; the
target: at 400 calls within 1.3x of at 20. Ours and the bare loop alternate within every round
so the machine's noise hits both; medians over the runs. Writes var/bench-step-cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = "bench-long"
INSTRUCTIONS = "Keep going."  # bench-long's
TARGET = 1.3  # the engine's per-step CPU at the longest run within this of the shortest's


def steps_of(calls: int) -> int:
    """The `steps` input of `long_policy` for a run of `calls` tool calls (2 calls + 1)."""
    return 2 * calls + 1


# ---------------------------------------------------------------------------- ours
def ours(calls: int, budget_s: float) -> dict:
    """One run of `calls` calls, slice after slice in this process: its CPU, wall, slices. A run
    still unfinished after `budget_s` seconds is left queued (`finished` False): an engine whose
    resumed slices replay the run's history may take a slice a step and never end in time."""
    from agentruns.models import Run
    from agentruns.runtime.engine.executor import RunExecutor
    from agentruns.services import execute_inline

    cpu, wall = time.process_time(), time.perf_counter()
    run, outcome = execute_inline(AGENT, {"steps": steps_of(calls)})
    slices = 1
    while outcome == "queued" and time.perf_counter() - wall < budget_s:  # yielded: go on
        outcome, slices = RunExecutor(run.id).advance(), slices + 1
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert outcome in ("succeeded", "queued"), outcome
    steps = Run.objects.get(id=run.id).step_count
    finished = outcome == "succeeded"
    assert steps == steps_of(calls) or not finished, (steps, calls)
    return {"cpu_s": cpu, "wall_s": wall, "slices": slices, "steps": steps, "finished": finished}


# ---------------------------------------------------------------------------- the bare loop
class BareLoop:
    """bench-long as a bare Pydantic AI agent: the scripted model playing `long_policy`, its
    tool doing the statement ours does, `agent.run()` on one event loop of this thread."""

    def __init__(self, dsn: str) -> None:
        import psycopg
        from pydantic_ai import Agent

        from agentruns.runtime.providers.scripted_model import scripted_model

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.agent = Agent(scripted_model(), name=AGENT, instructions=INSTRUCTIONS)
        conn = self.conn

        @self.agent.tool_plain(name="bench_lookup")
        def bench_lookup(order_id: str) -> dict:
            # the statement of benchmarks/workload.py's bench_lookup
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT amount_cents FROM support_order WHERE order_id = %s", [order_id]
                )
                return {"order_id": order_id, "amount_cents": cursor.fetchone()[0]}

        self.loop = asyncio.new_event_loop()

    def run(self, calls: int) -> dict:
        from pydantic_ai.usage import UsageLimits

        from agentruns.runtime.providers.scripted_model import Playing, playing
        from benchmarks.workload import long_policy

        prompt = json.dumps({"steps": steps_of(calls)}, sort_keys=True)
        cpu, wall = time.process_time(), time.perf_counter()
        with playing(Playing(policy=long_policy, instructions=INSTRUCTIONS)):
            result = self.loop.run_until_complete(
                self.agent.run(prompt, usage_limits=UsageLimits(request_limit=None))
            )
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert result.output == "Done.", result.output
        asked = sum(1 for m in result.all_messages() if m.kind == "response")
        assert asked == calls + 1, (asked, calls)
        return {"cpu_s": cpu, "wall_s": wall, "steps": steps_of(calls)}

    def close(self) -> None:
        self.loop.close()
        self.conn.close()


# ---------------------------------------------------------------------------- the bench
def runs_for(calls: int, quick: bool) -> int:
    """Runs of `calls` calls per system and round: about 400 (quick: 100) calls' worth."""
    return max(1, (100 if quick else 400) // calls)


def measure(lengths: list[int], rounds: int, quick: bool, dsn: str, budget_s: float) -> list[dict]:
    bare = BareLoop(dsn)
    seen: dict[int, dict[str, list[dict]]] = {n: {"ours": [], "bare": []} for n in lengths}
    unfinished: dict[int, dict] = {}  # a length whose run ran out of budget is not run again
    try:
        for _ in range(2):  # warm up both: imports, plans, caches
            ours(lengths[0], budget_s)
            bare.run(lengths[0])
        for round_no in range(rounds):
            for calls in lengths:
                for _ in range(runs_for(calls, quick)):
                    if calls in unfinished:
                        break
                    order = (("ours", ours), ("bare", bare.run))  # ours first in even rounds
                    for side, system in order if round_no % 2 == 0 else order[::-1]:
                        got = system(calls, budget_s) if side == "ours" else system(calls)
                        if not got.get("finished", True):
                            unfinished[calls] = got
                            if not seen[calls]["bare"]:  # the loop's own, for comparison
                                seen[calls]["bare"].append(bare.run(calls))
                            break
                        seen[calls][side].append(got)
            print(f"  round {round_no + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        bare.close()
    return [row(calls, seen[calls], unfinished.get(calls)) for calls in lengths]


def row(calls: int, seen: dict[str, list[dict]], unfinished: dict | None) -> dict:
    steps = steps_of(calls)
    if unfinished is not None:
        out = {
            "calls": calls,
            "steps": steps,
            "finished": False,
            "steps_done": unfinished["steps"],
            "slices": unfinished["slices"],
            "cpu_s": unfinished["cpu_s"],
            "wall_s": unfinished["wall_s"],
            "ours_cpu_ms_per_step_done": unfinished["cpu_s"] * 1000 / max(1, unfinished["steps"]),
        }
        if seen["bare"]:
            bare_ms = statistics.median(r["cpu_s"] for r in seen["bare"]) * 1000
            out["bare_cpu_ms_per_run"], out["bare_cpu_ms_per_step"] = bare_ms, bare_ms / steps
        print(
            f"  {calls} calls: UNFINISHED, {unfinished['steps']} of {steps} steps after "
            f"{unfinished['slices']} slices ({unfinished['wall_s']:.0f} s, "
            f"{unfinished['cpu_s']:.0f} s CPU)",
            file=sys.stderr,
            flush=True,
        )
        return out
    mine, loop = seen["ours"], seen["bare"]
    ours_ms = statistics.median(r["cpu_s"] for r in mine) * 1000
    bare_ms = statistics.median(r["cpu_s"] for r in loop) * 1000
    out = {
        "calls": calls,
        "steps": steps,
        "finished": True,
        "runs": len(mine),
        "ours_cpu_ms_per_run": ours_ms,
        "bare_cpu_ms_per_run": bare_ms,
        "ours_cpu_ms_per_step": ours_ms / steps,
        "bare_cpu_ms_per_step": bare_ms / steps,
        "engine_cpu_ms_per_step": (ours_ms - bare_ms) / steps,
        "ours_wall_ms_per_run": statistics.median(r["wall_s"] for r in mine) * 1000,
        "bare_wall_ms_per_run": statistics.median(r["wall_s"] for r in loop) * 1000,
        "slices_median": statistics.median(r["slices"] for r in mine),
        "slices_min_max": [min(r["slices"] for r in mine), max(r["slices"] for r in mine)],
    }
    print(
        f"  {calls} calls ({steps} steps): ours {out['ours_cpu_ms_per_step']:.3f}, bare "
        f"{out['bare_cpu_ms_per_step']:.3f}, engine {out['engine_cpu_ms_per_step']:.3f} ms CPU "
        f"per step; {out['slices_median']:g} slices",
        file=sys.stderr,
        flush=True,
    )
    return out


def growth(rows: list[dict]) -> float | None:
    """The engine's per-step CPU at the longest run / at the shortest (None: not both ran)."""
    if not all(r["finished"] for r in rows):
        return None
    first, last = rows[0]["engine_cpu_ms_per_step"], rows[-1]["engine_cpu_ms_per_step"]
    return last / first if first > 0 else None


def markdown(data: dict) -> str:
    rows, ratio = data["rows"], data["growth"]
    lines = [
        "## The engine's own CPU per step as a run grows (issue 43, item 2)",
        "",
        'Command: `PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m '
        "benchmarks.step_cost` (part of `make bench`); method in `benchmarks/step_cost.py`. "
        "Runs of `bench-long` (one read-only tool call per model turn) in process, "
        + (
            f"slices of {data['slice_seconds']:g} s (AGENTRUNS_SLICE_SECONDS: a long run is "
            "resumed several times)"
            if data["slice_seconds"]
            else "slices of the deployment's default length"
        )
        + ", against the same agent, model function and tool run by plain `agent.run()`. "
        f"CPU time of the process (not wall time); a run's budget {data['budget_s']:g} s; "
        f"{data['rounds']} interleaved round(s), medians; "
        f"1-minute load average {data['loadavg']:.1f} on {os.cpu_count()} cores shared with other "
        "work.",
        "",
        "| tool calls | steps | runs | ours CPU per run (ms) | bare loop CPU per run (ms) | "
        "ours per step (ms) | bare loop per step (ms) | **engine's own per step (ms)** | "
        "slices per run (min-max) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if not r["finished"]:
            lines.append(
                f"| {r['calls']} | {r['steps']} | 1 | did not finish: {r['steps_done']} steps "
                f"after {r['slices']} slices, {r['wall_s']:.0f} s ({r['cpu_s'] * 1000:.0f} ms "
                f"CPU) | {r.get('bare_cpu_ms_per_run', 0):.0f} | "
                f"{r['ours_cpu_ms_per_step_done']:.3f} (of the steps done) | "
                f"{r.get('bare_cpu_ms_per_step', 0):.3f} | | {r['slices']} |"
            )
            continue
        lo, hi = r["slices_min_max"]
        lines.append(
            f"| {r['calls']} | {r['steps']} | {r['runs']} | {r['ours_cpu_ms_per_run']:.0f} | "
            f"{r['bare_cpu_ms_per_run']:.0f} | {r['ours_cpu_ms_per_step']:.3f} | "
            f"{r['bare_cpu_ms_per_step']:.3f} | **{r['engine_cpu_ms_per_step']:.3f}** | "
            f"{r['slices_median']:g} ({lo}-{hi}) |"
        )
    if ratio is not None:
        verdict = f"{ratio:.2f}x ({'met' if ratio <= TARGET else 'not met'}: target {TARGET}x)"
    elif not all(r["finished"] for r in rows):
        verdict = f"not met: a run did not finish within {data['budget_s']:g} s"
    else:
        verdict = "not measured"
    lines += [
        "",
        f"The engine's own CPU per step at {rows[-1]['calls']} calls against at "
        f"{rows[0]['calls']}: **{verdict}**.",
    ]
    return "\n".join(lines) + "\n"


def setup(slice_seconds: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SCRIPTED_MODEL_DELAY_MS", "0")
    os.environ.setdefault("SCRIPTED_MODEL_LATENCY_MS", "0")
    os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    if slice_seconds:
        os.environ["AGENTRUNS_SLICE_SECONDS"] = str(slice_seconds)  # read once, at first use
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", stdout=devnull)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, fewer runs")
    parser.add_argument("--calls", default="20,400", help="tool calls per run, shortest first")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (0: 3, quick 1)")
    parser.add_argument(
        "--slice-seconds", type=float, default=5.0, help="0: the deployment's (Q_TIMEOUT / 2)"
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=0,
        help="a run's wall-time budget (0: 300, quick 120)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "var" / "bench-step-cost.json")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    quick = args.quick or bool(os.environ.get("BENCH_QUICK"))
    rounds = args.rounds or (1 if quick else 3)
    lengths = sorted(int(n) for n in args.calls.split(","))
    setup(args.slice_seconds)
    dsn = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    print("the engine's own CPU per step (ours - the bare loop):", file=sys.stderr)
    budget = args.budget_seconds or (120 if quick else 300)
    rows = measure(lengths, rounds, quick, dsn, budget)
    data = {
        "rows": rows,
        "growth": growth(rows),
        "target": TARGET,
        "slice_seconds": args.slice_seconds,
        "budget_s": budget,
        "rounds": rounds,
        "quick": quick,
        "loadavg": os.getloadavg()[0],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2))
    text = markdown(data)
    print(text)
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section("step-cost", text)


if __name__ == "__main__":
    main()
