"""A/B of the in-process engine's client CPU as instructions executed (valgrind's callgrind).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.ab_instructions \
        --a /path/to/old-checkout --b . --runs 30 --rounds 2

On a 2-core machine shared with other work, `benchmarks/ab_engine.py`'s runs/s and CPU ms per
run move by 30-70% between rounds of the same checkout, more than a cut of a few percent. The
number of instructions the engine's process executes per run does not depend on the load: each
side runs `--runs` refund runs with `execute_inline` under callgrind, instrumented only inside
the timed loop (`callgrind_control -i on/off` around it, after a warm-up), and prints the
instructions per run (all the process's threads; the database server's are not counted).
Under valgrind a run takes ~50x longer: 30 runs are about a minute per side.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

from benchmarks.ab_engine import create_database, database_url
from benchmarks.procs import python_for

CHILD = r"""
import os, subprocess, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from django.core.management import call_command
if sys.argv[1] == "setup":
    call_command("migrate", verbosity=0)
    call_command("seed_demo", stdout=open(os.devnull, "w"))
    raise SystemExit(0)
from agentruns.services import execute_inline
runs = int(sys.argv[1])
for i in range(10):  # warm-up, not counted
    execute_inline("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"})
toggle = ["callgrind_control", "-i"]
subprocess.run([*toggle, "on", str(os.getpid())], check=True, capture_output=True)
for i in range(runs):
    _, outcome = execute_inline("bench-refund", {"order_id": f"ORD-{1001 + i % 50}"})
    assert outcome == "succeeded", outcome
subprocess.run([*toggle, "off", str(os.getpid())], check=True, capture_output=True)
"""


def instructions_per_run(checkout: Path, url: str, runs: int) -> float:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SCRIPTED_MODEL_DELAY_MS": "0",
        "AGENTRUNS_AGENT_MODULES": "benchmarks.workload",
        "LOG_LEVEL": "WARNING",
        "PYTHONHASHSEED": "0",
    }
    child = [python_for(checkout), "-c", CHILD]
    subprocess.run([*child, "setup"], cwd=checkout, env=env, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "callgrind.log"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={tmp}/callgrind.out",
                f"--log-file={log}",
                *child,
                str(runs),
            ],
            cwd=checkout,
            env=env,
            check=True,
        )
        collected = re.search(r"Collected : (\d+)", log.read_text())
    if collected is None:
        raise RuntimeError(f"no instruction count in callgrind's log of {checkout}")
    return int(collected.group(1)) / runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", required=True, type=Path)
    parser.add_argument("--b", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    counts: dict[str, list[float]] = {"a": [], "b": []}
    for round_no in range(args.rounds):
        for side in ("a", "b") if round_no % 2 == 0 else ("b", "a"):
            name = f"abi_{side}_{round_no}"
            create_database(base, name)
            count = instructions_per_run(getattr(args, side), database_url(base, name), args.runs)
            counts[side].append(count)
        print(
            f"round {round_no + 1}: A {counts['a'][-1] / 1e6:.2f} M, "
            f"B {counts['b'][-1] / 1e6:.2f} M instructions per run",
            flush=True,
        )
    a, b = (sum(counts[s]) / len(counts[s]) for s in ("a", "b"))
    print(f"mean A {a / 1e6:.2f} M, B {b / 1e6:.2f} M instructions per run; B/A {b / a:.3f}")


if __name__ == "__main__":
    main()
