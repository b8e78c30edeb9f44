"""Claims from PostgreSQL against the doorbell per start, side by side (issue 22, items 2-3).

    git worktree add /tmp/claims-base <the main you compare with>   # once; symlink .venv into it
    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.claims_ab \
        --base /tmp/claims-base [--ns 1,200,1000] [--write-docs]

Each side is a checkout; its own `benchmarks.inflight.ours_latency_bound` runs in a subprocess
with that checkout first on the path (the same harness as `make bench`: the seven-step refund
flow, every model turn waiting 500 ms, N runs started together by 8 clients, one real `qcluster`
with its defaults, 2 worker processes). Both sides use the same throwaway PostgreSQL server, one
after the other, each in a database of its own (its own migrations). Besides the harness's wall, RSS and connections it records, per side: the
statements one start sends (Django's query log around `start_run`, as the API starts a run) and
PostgreSQL's committed transactions per run over each batch (`pg_stat_database.xact_commit`,
every process included: starts, claims or doorbells, the engine's commits, q2's bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TURN_MS = 500
# the harness's sleeping workload (`benchmarks.inflight.run_all`): the refund flow, no key
SLEEPING = {
    "name": "sleeping",
    "agent": "bench-refund",
    "env": {"SCRIPTED_MODEL_LATENCY_MS": TURN_MS, "SCRIPTED_MODEL_DELAY_MS": 0},
    "turn_ms": TURN_MS,
}


def side(ns: tuple[int, ...]) -> dict:
    """In a side's subprocess (its checkout first on sys.path): the harness, plus our counters."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    from benchmarks import inflight

    inflight.setup()
    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agentruns.services import start_run

    with CaptureQueriesContext(connection) as queries:
        start_run("bench-refund", {"order_id": "ORD-1001"})
    statements = len(queries)  # `run` waits queued: the cluster below takes it as it starts

    def commits() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    counted: list[int] = []
    cpu: list[tuple[float, float]] = []
    original = inflight.start_together

    def start_together(n: int, *agent: str):  # the harness's own start, counters around it
        counted.append(commits())
        cpu.append(cpu_seconds())
        return original(n, *agent)

    inflight.start_together = start_together
    original_wait = inflight.wait_done

    shares: list[float] = []

    def wait_done(ids: list, timeout: float = 600) -> float:
        from django.db.models import Count

        from agentruns.models import StepAttempt

        done = original_wait(ids, timeout)
        counted[-1] = (commits() - counted[-1]) / len(ids)
        workers, server = cpu_seconds()
        cpu[-1] = ((workers - cpu[-1][0]) / len(ids), (server - cpu[-1][1]) / len(ids))
        # how evenly the worker processes shared the batch: the busiest one's share of attempts
        per_owner = StepAttempt.objects.filter(step__run_id__in=ids).values("worker")
        per_process: dict[str, int] = {}
        for row in per_owner.annotate(n=Count("id")):  # an owner is host:pid:<executor tag>
            process = row["worker"].rsplit(":", 1)[0]
            per_process[process] = per_process.get(process, 0) + row["n"]
        total = sum(per_process.values())
        shares.append(max(per_process.values()) / total if total else 0.0)
        return done

    inflight.wait_done = wait_done
    rows, config = inflight.ours_latency_bound(ns, SLEEPING)
    measured = zip(rows, counted[-len(ns) :], shares[-len(ns) :], cpu[-len(ns) :], strict=True)
    for row, xacts, share, (workers_cpu, server_cpu) in measured:
        row["xact_per_run"], row["busiest_share"] = xacts, share
        row["worker_cpu_ms"], row["pg_cpu_ms"] = workers_cpu * 1000, server_cpu * 1000
    return {"rows": rows, "config": config, "start_statements": statements}


def pickup(samples: int = 30) -> dict:
    """In a side's subprocess: one start at a time against an idle `qcluster`, the time from the
    run's creation to its claim (`started_at - created_at`, both stamped by the database side)."""
    import time

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    from benchmarks import inflight

    inflight.setup()
    django.setup()
    from agentruns.models import Run
    from agentruns.services import start_run
    from benchmarks import procs

    proc = inflight.start_qcluster(SCRIPTED_MODEL_LATENCY_MS=0, SCRIPTED_MODEL_DELAY_MS=0)
    try:
        time.sleep(3)
        inflight.wait_done(inflight.start_together(8)[0])  # warm up
        ids = []
        for i in range(samples):
            ids.append(start_run("bench-refund", {"order_id": f"ORD-{1001 + i}"}).run.id)
            time.sleep(0.3)
        inflight.wait_done(ids)
    finally:
        procs.stop(proc)
    delays = sorted(
        (r.started_at - r.created_at).total_seconds() * 1000 for r in Run.objects.filter(id__in=ids)
    )
    return {"p50_ms": inflight.pct(delays, 50), "p90_ms": inflight.pct(delays, 90)}


def claim_cpu(backlog: int, batch: int = 50) -> dict:
    """In a side's subprocess, no cluster: `backlog` queued runs, then the claimers' statement
    (`claims.claim_queued(batch)`) until none is left. CPU per claimed run of this process (the
    client: building and reading the statement) and of its PostgreSQL backend (planning,
    executing), and the statements' wall time."""
    import gc
    import time

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    from benchmarks import inflight

    inflight.setup()
    django.setup()
    from django.db import connection

    from agentruns.models import Run
    from agentruns.runtime.dispatch import claims
    from agentruns.runtime.execution import transitions
    from agentruns.services import start_run

    Run.objects.filter(status="queued").delete()
    for i in range(backlog):
        start_run("bench-refund", {"order_id": f"ORD-{1001 + i % 250}"})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentruns_run")
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    events = transitions.started().events
    claims.claim_queued(1, events)  # warm: the statement's first plan, the row converters
    gc.collect()  # what the setup (migrate, seed) left is not the claims' to collect
    client0, server0, wall0 = time.process_time(), _process_cpu(backend), time.perf_counter()
    claimed = 0
    while True:
        taken = len(claims.claim_queued(batch, events))
        if not taken:
            break
        claimed += taken
    wall = time.perf_counter() - wall0
    client, server = time.process_time() - client0, _process_cpu(backend) - server0
    return {
        "backlog": backlog,
        "claimed": claimed,
        "client_us_per_run": client / claimed * 1e6,
        "server_us_per_run": server / claimed * 1e6,
        "wall_us_per_run": wall / claimed * 1e6,
    }


def _process_cpu(pid: int, children: bool = False) -> float:
    """utime + stime (and the reaped children's, with `children`) of a process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float]:
    """CPU so far of (the whole `qcluster`: every process of its process group, q2's pusher,
    monitor and sentinel included; the whole PostgreSQL server: the postmaster with its reaped
    backends plus the live ones)."""
    from django.db import connection

    from agentruns.models import WorkerHeartbeat

    groups = set()
    for name in WorkerHeartbeat.objects.filter(worker__startswith="pool@").values_list(
        "worker", flat=True
    ):
        try:
            groups.add(os.getpgid(int(name.rsplit(":", 1)[1])))
        except ProcessLookupError:  # a row of an earlier cluster
            pass
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        (data_dir,) = cursor.fetchone()
    postmaster = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
    workers, server = 0.0, _process_cpu(postmaster, children=True)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ppid, pgrp = int(fields[1]), int(fields[2])
        if ppid == postmaster:
            server += _process_cpu(int(stat.parent.name))
        elif pgrp in groups:
            workers += _process_cpu(int(stat.parent.name))
    return workers, server


def side_database(name: str) -> str:
    """DATABASE_URL of a database of the side's own on the same server (created when missing):
    each checkout migrates its own schema, so a side whose models lack a column the other side's
    migrations added never writes to that table."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    head, _, tail = url.rpartition("/")
    database, _, query = tail.partition("?")
    side = f"{database}_{name}"
    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [side]).fetchone():
            conn.execute(f'CREATE DATABASE "{side}"')
    return f"{head}/{side}" + (f"?{query}" if query else "")


def run_side(checkout: Path, ns: tuple[int, ...], call: str = "", database: str = "") -> dict:
    # this file's `side`, loaded by path in a process whose `benchmarks` and `agentruns` are the
    # checkout's
    env = dict(os.environ, DATABASE_URL=database) if database else None
    code = (
        f"import sys, json, importlib.util; sys.path.insert(0, {str(checkout)!r}); "
        f"spec = importlib.util.spec_from_file_location('claims_ab_side', {__file__!r}); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        f"print('@@' + json.dumps({call or f'module.side({ns!r})'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@")]
    if done.returncode or not lines:
        raise RuntimeError(f"{checkout}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    sys.stderr.write(done.stdout[-1500:])
    return json.loads(lines[-1][2:])


def markdown(base: dict, ours: dict, base_label: str, label: str = "claims (this branch)") -> str:
    head = (
        "| side | round | runs per process | N | wall (s) | x one run | runs/s | peak RSS (MB) | "
        "RSS growth (MB) | peak PG connections | commits per run | busiest process's share | "
        "qcluster CPU per run (ms) | PostgreSQL CPU per run (ms) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for side_label, data in ((base_label, base), (label, ours)):
        for r in data["rows"]:
            one = next(
                (o["wall_s"] for o in data["rows"] if o["n"] == 1 and o["round"] == r["round"]),
                None,
            )
            ratio = f"{r['wall_s'] / one:.2f}" if one else "-"
            lines.append(
                f"| {side_label} | {r['round']} | {data['config']['per_process']} | {r['n']} | "
                f"{r['wall_s']:.2f} | {ratio} | {r['n'] / r['wall_s']:.1f} | {r['rss_mb']:.0f} | "
                f"{r['rss_growth_mb']:.0f} | {r['pg_connections']} | {r['xact_per_run']:.1f} | "
                f"{r['busiest_share']:.2f} | {r.get('worker_cpu_ms', 0):.1f} | "
                f"{r.get('pg_cpu_ms', 0):.1f} |"
            )
    statements = (
        f"Statements one start sends (`start_run` as the API calls it): {base_label} "
        f"{base['start_statements']}, {label} {ours['start_statements']}."
    )
    return head + "\n".join(lines) + "\n\n" + statements + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="checkout of the main to compare with")
    parser.add_argument("--ns", default="1,200,1000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--pickup", action="store_true", help="only creation -> claim, one at a time"
    )
    parser.add_argument(
        "--claim-cpu", action="store_true", help="only the claim statement's CPU, no cluster"
    )
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--base-label", default="main (doorbell per start)")
    parser.add_argument("--label", default="claims (this branch)")
    parser.add_argument("--section", default="claims-ab", help="the docs section it writes")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    ns = tuple(int(n) for n in args.ns.split(","))
    if args.pickup:
        for round_no in range(args.rounds):
            for label, checkout in (("main", Path(args.base).resolve()), ("claims", ROOT)):
                got = run_side(checkout, ns, call="module.pickup()")
                print(f"pickup round {round_no + 1} {label}: {got}", flush=True)
        return
    databases = {"base": side_database("base"), "ours": side_database("ours")}
    if args.claim_cpu:
        print(
            "| side | round | backlog | client CPU per claimed run (us) | PostgreSQL CPU "
            "per claimed run (us) | wall per claimed run (us) |\n|---|---:|---:|---:|---:|---:|"
        )
        for round_no in range(args.rounds):
            for backlog in ns:
                for label, checkout, name in (
                    (args.base_label, Path(args.base).resolve(), "base"),
                    (args.label, ROOT, "ours"),
                ):
                    got = run_side(
                        checkout, ns, call=f"module.claim_cpu({backlog})", database=databases[name]
                    )
                    print(
                        f"| {label} | {round_no + 1} | {backlog} | {got['client_us_per_run']:.0f} "
                        f"| {got['server_us_per_run']:.0f} | {got['wall_us_per_run']:.0f} |",
                        flush=True,
                    )
        return
    base, ours = {"rows": []}, {"rows": []}
    for round_no in range(args.rounds):  # alternating: a shared machine's load drifts
        for into, checkout, name in (
            (base, Path(args.base).resolve(), "base"),
            (ours, ROOT, "ours"),
        ):
            got = run_side(checkout, ns, database=databases[name])
            into.update({k: v for k, v in got.items() if k != "rows"})
            into["rows"] += [{**row, "round": round_no + 1} for row in got["rows"]]
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "bench-claims-ab.json").write_text(json.dumps({"base": base, "ours": ours}))
    text = markdown(base, ours, args.base_label, args.label)
    print(text)
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section(args.section, text)


if __name__ == "__main__":
    main()
