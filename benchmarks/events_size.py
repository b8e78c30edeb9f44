"""What runs leave in the database, and what the retention purge takes back (issue 30, item 6;
part of `make bench`).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.events_size \
        [--runs 1000] [--write-docs]

`--runs` refund runs (the demo's `refund` agent on the offline `scripted` model, streaming its
text at the default SCRIPTED_MODEL_DELAY_MS into `model.delta` events every
AGENTRUNS_DELTA_FLUSH_MS, as a real model's would be) through a real worker (`qcluster`, its
defaults) and the refund gateway in a real web process; `pg_total_relation_size` (the table,
its indexes and TOAST) of the runtime's tables before and after the batch, per 1,000 runs. Then
the purge of those runs (runtime/retention.py, batches of 500, in this process): its time and
what it deleted, and the tables' size after it and after a plain VACUUM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

QUICK = bool(os.environ.get("BENCH_QUICK"))
SECTION = "events-size"
TABLES = ("agentruns_runevent", "agentruns_step", "agentruns_stepattempt", "agentruns_run")
CLIENTS = 8


def setup(orders: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=orders, stdout=devnull)


def sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relname = ANY(%s)",
            [list(TABLES)],
        )
        return dict(cursor.fetchall())


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM {table}")


def run_batch(runs: int) -> tuple[list, float]:
    """`runs` refund runs through a real worker and web process; (their ids, wall seconds)."""
    from django.db import connection

    from agentruns.models import Run
    from agentruns.services import start_run
    from benchmarks.procs import QUOTAS_OFF_THE_WAY, start_qcluster, start_web, stop, stop_web

    env = {**os.environ, **QUOTAS_OFF_THE_WAY, "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000"}
    web, url = start_web(ROOT, env)
    worker_env = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    worker = start_qcluster(
        os.environ["DATABASE_URL"], **worker_env, REFUND_GATEWAY_URL=url + "/gateway"
    )
    try:
        time.sleep(5)  # the cluster up before the batch

        def one(i: int):
            try:
                run_input = {"order_id": f"ORD-{1001 + i}", "message": "It arrived broken"}
                return start_run("refund", run_input).run.id
            finally:
                connection.close()

        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as clients:
            ids = list(clients.map(one, range(runs)))
        deadline = started + 1800
        while Run.objects.filter(id__in=ids, finished_at__isnull=True).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{runs} runs did not finish")
            time.sleep(1)
        return ids, time.monotonic() - started
    finally:
        stop(worker)
        stop_web(web)


def measure(runs: int) -> dict:
    from agentruns.models import Run, RunEvent
    from agentruns.runtime import retention

    vacuum()
    before = sizes()
    ids, wall = run_batch(runs)
    after = sizes()
    events = RunEvent.objects.filter(run_id__in=ids).count()
    succeeded = Run.objects.filter(id__in=ids, status="succeeded").count()
    started = time.perf_counter()
    deleted = retention.purge(timedelta(0))
    purge_s = time.perf_counter() - started
    purged = sizes()
    vacuum()
    vacuumed = sizes()
    return {
        "runs": runs,
        "succeeded": succeeded,
        "batch_wall_s": wall,
        "events_per_run": events / runs,
        "bytes_per_1000_runs": {t: (after[t] - before[t]) * 1000 // runs for t in TABLES},
        "purge_s": purge_s,
        "deleted": dict(deleted),
        "bytes_after_purge": purged,
        "bytes_after_vacuum": vacuumed,
    }


def report(row: dict, load: float) -> str:
    def mb(n: int) -> str:
        return f"{n / 1e6:.1f} MB"

    per = row["bytes_per_1000_runs"]
    lines = [
        "## What runs leave behind, and the retention purge (issue 30, item 6)",
        "",
        "Written by `benchmarks/events_size.py` in `make bench`: "
        f"{row['runs']} refund runs on the scripted model (streaming its text into `model.delta` "
        "events at the defaults) through a real `qcluster`, "
        f"{row['events_per_run']:.1f} events a run; `pg_total_relation_size` (table, indexes, "
        "TOAST) before and after, per 1,000 runs. Then `retention.purge` of those runs (batches "
        f"of 500). 1-minute load average at the end: {load:.1f} (2 cores shared).",
        "",
        "| table | per 1,000 runs | after the purge | after a plain VACUUM |",
        "|---|---:|---:|---:|",
    ]
    for table in TABLES:
        lines.append(
            f"| `{table}` | **{mb(per[table])}** | {mb(row['bytes_after_purge'][table])} | "
            f"{mb(row['bytes_after_vacuum'][table])} |"
        )
    rows = sum(row["deleted"].values())
    lines += [
        "",
        f"The purge deleted {row['deleted'].get('agentruns_run', 0)} runs and {rows} rows in all "
        f"in {row['purge_s']:.1f} s ({row['deleted'].get('agentruns_run', 0) / max(row['purge_s'], 1e-9):.0f} "
        "runs a second): "
        + ", ".join(f"`{t}` {n}" for t, n in sorted(row["deleted"].items()))
        + ". Right after the purge the files keep their size (dead rows until a vacuum). Here "
        "the purge took every row, so a plain VACUUM cut the empty pages off the end of each "
        "file; in a table whose newer rows stay after the purged ones, VACUUM (autovacuum) "
        "marks the space free for new rows instead, and only `VACUUM FULL` gives it back to "
        "the system, locking the table while it rewrites it.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200 if QUICK else 1000)
    parser.add_argument("--json", type=Path, default=ROOT / "var" / "bench-events-size.json")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    setup(orders=args.runs)
    row = measure(args.runs)
    print(json.dumps(row))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(row, indent=2))
    text = report(row, os.getloadavg()[0])
    print(text)
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section(SECTION, text)


if __name__ == "__main__":
    main()
