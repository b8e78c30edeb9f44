"""What runs asleep cost at rest: a real qcluster over a database with N runs waiting on a timer
(due in a day) against the same with none, side by side.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.sleeping_runs \
        [--asleep 10000] [--seconds 30] [--settle 10]

Each case: a fresh database (migrated and seeded, `idle_sockets.seeded_database`), N waiting
runs each with a pending timer `Wait` (bulk-inserted: the state a sleeping run leaves, without
running 10,000 runs to their sleep first), a qcluster started on it; after `--settle` seconds,
over `--seconds`: the resident memory of the whole qcluster (its process group: main process,
sentinel, workers, pusher, monitor) at the end, and PostgreSQL's committed transactions per
second in that database (pg_stat_database.xact_commit delta; the harness's two reads are in
another database). Nothing is due in the window, so what differs is what sleeping runs cost.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.idle_sockets import admin, commits, manage, seeded_database
from benchmarks.procs import ROOT, start_qcluster, stop
from benchmarks.sampling import rss_mb

ASLEEP = """
import uuid
from datetime import timedelta
from django.utils import timezone
from agentruns.models import Run, Wait
due = timezone.now() + timedelta(days=1)
for start in range(0, {n}, 2000):
    runs = Run.objects.bulk_create(
        [Run(agent="refund", input={{}}, status="waiting") for _ in range(min(2000, {n} - start))]
    )
    Wait.objects.bulk_create(
        [Wait(run=r, ordinal=0, name="tool:sleep", kind="timer", token=uuid.uuid4().hex,
              due_at=due) for r in runs]
    )
print(Wait.objects.filter(status="pending").count())
"""


def group_rss_mb(pgid: int) -> float:
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid:  # pgrp
            total += rss_mb(int(stat.parent.name))
    return round(total, 1)


def case(asleep: int, seconds: float, settle: float) -> dict:
    env = seeded_database(ROOT, f"asleep_{asleep}", {})
    name = env["DATABASE_URL"].rsplit("/", 1)[-1]
    pending = int(manage(ROOT, env, "shell", "-c", ASLEEP.format(n=asleep)).split()[-1])
    worker = start_qcluster(env["DATABASE_URL"], LOG_LEVEL="WARNING")
    try:
        time.sleep(settle)
        tx0, t0 = commits(name), time.monotonic()
        time.sleep(seconds)
        tx1, t1 = commits(name), time.monotonic()
        rss = group_rss_mb(worker.pid)
        still = int(
            manage(
                ROOT,
                env,
                "shell",
                "-c",
                "from agentruns.models import Run; print(Run.objects.filter(status='waiting').count())",
            ).split()[-1]
        )
    finally:
        stop(worker)
        admin(f"DROP DATABASE {name} WITH (FORCE)")
    row = {
        "asleep": asleep,
        "pending_waits": pending,
        "still_waiting": still,
        "worker_rss_mb": rss,
        "pg_xact_per_s": round((tx1 - tx0) / (t1 - t0), 2),
        "seconds": seconds,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--asleep", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--settle", type=float, default=10)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    rows = [case(n, args.seconds, args.settle) for n in (0, args.asleep)]
    none, many = rows
    print(
        f"at rest, {args.asleep} runs asleep vs none: worker RSS {many['worker_rss_mb']} vs "
        f"{none['worker_rss_mb']} MB, PostgreSQL {many['pg_xact_per_s']} vs "
        f"{none['pg_xact_per_s']} transactions/s"
    )


if __name__ == "__main__":
    main()
