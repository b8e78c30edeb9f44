"""Where a run's CPU goes in the real deployment, two checkouts side by side (issue 43).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.deployment \
        [--a /tmp/base] [--b .] [--rounds 3] [--runs 100] [--streaming-runs 200] [--token-ms 15] \
        [--profile] [--json var/bench-deployment.json]

(`git worktree add /tmp/base <commit>` makes a checkout of an older commit; both checkouts run
on this venv's interpreter, each with its own code.) Without `--a` only B, the working tree by
default, is measured (`make bench` does so unless BENCH_BASELINE names a baseline checkout);
`benchmarks/targets.py` reads the JSON.

Per checkout and round, on the one throwaway PostgreSQL server: a fresh database migrated and
`seed_demo`ed by that checkout's own code; its daphne (`procs.start_web`, as the Procfile runs
it; it also serves the demo's refund gateway) and ONE `manage.py qcluster` with its defaults, no
Redis. The workload: the demo `refund` agent (support/agents.py) played by the scripted model,
streaming its words (SCRIPTED_MODEL_DELAY_MS = `--token-ms` per token, no latency); refunds
never need approval (REFUND_APPROVAL_THRESHOLD_CENTS high), quotas out of the way, and every run
on an order of its own (no run waits in its order's line or finds the refund already done).
Through the API only, as an outsider: `POST /api/runs` with a bearer token of `lead`, then
`GET /api/runs/<id>` until it succeeded.

Phases: warm-up (5 runs, one at a time); one run alone (median of 5; its status polled every
20 ms); then the batch: `--runs` runs POSTed together by 8 client threads, each client polling
its unfinished runs every `--poll-ms` (a sweep of GETs, then a pause) until all succeeded; then,
with `--streaming-runs N`, a second batch of N. Wall times are from the first POST sent to the
last `finished_at` the worker wrote (the polled times, a poll late, are in the JSON).

Per batch, from /proc (before/after, so exited processes count through their parents' children
times): CPU seconds per run of the qcluster (its whole process group), daphne, PostgreSQL (the
postmaster and its backends) and this harness (the clients); the machine's idle and system
shares (/proc/stat); the load average. Sampled every second during the batch: each qcluster
process's threads (its `/proc/<pid>/task`), and their context switches (each thread's
`voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches`: /proc/<pid>/status alone counts only
the main thread's; a thread's switches after the last sample before it exits are missed, so
it is a lower bound; the machine's /proc/stat `ctxt` is exact but counts everything), peak RSS
and PostgreSQL connections of the worker processes (`sampling.Sampler`). Per run, from the
database: steps (model, tool) and `model.delta` events, and the text deltas the scripted model
streamed per turn (its tokens), which the floor plays.

The floor (`benchmarks/bare_loop.py`, in a subprocess, once per round): the same agent shape as
a bare Pydantic AI agent in memory; the headline is worker CPU per run / the floor's (target 2x).
Beside it, the same agent under Pydantic AI's durable hooks with nothing recorded
(`PassThroughDurability`): what the framework's durability costs before the engine's own work.

`--rounds` alternate A and B (A first in odd rounds) so the machine's noise hits both; the table
shows the median over rounds (min-max). `--profile`: after B's batch in the last round, one more
batch of the same size with `py-spy record --pid <qcluster> --subprocesses --gil --nonblocking`
attached (so the table's figures carry no sampler), the top 40 functions by own and cumulative
samples printed and the collapsed stacks (and an SVG flame graph) written to `var/perf/`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg

from benchmarks import flamegraph, procs
from benchmarks.cpu_split import CpuSplit, group_cpu, group_processes
from benchmarks.idle_sockets import admin, cpu_seconds, manage, seeded_database
from benchmarks.sampling import Sampler, pct, with_app

ROOT = Path(__file__).resolve().parent.parent
PERF = ROOT / "var" / "perf"
AGENT = "refund"
CLIENTS = 8
WARMUP_RUNS = 5
ALONE_RUNS = 5
WORKER_APP = "agentruns-worker"
APPROVAL_OFF = str(10**9)  # cents: no demo order's refund needs approval
_TOKEN = re.compile(r"\S+\s*|\s+")  # the scripted model's tokens: one text delta each


# ---------------------------------------------------------------------------- the deployment
class Deployment:
    """A checkout's daphne and qcluster on a fresh database of its own."""

    def __init__(self, checkout: Path, label: str, token_ms: float, orders: int) -> None:
        self.checkout = checkout
        extra = {
            **procs.QUOTAS_OFF_THE_WAY,
            "REFUND_APPROVAL_THRESHOLD_CENTS": APPROVAL_OFF,
            "SCRIPTED_MODEL_DELAY_MS": str(token_ms),
            "SCRIPTED_MODEL_LATENCY_MS": "0",
        }
        self.env = seeded_database(
            checkout, f"deploy_{label.lower()}", extra, ("--orders", str(orders))
        )
        self.dsn = self.env["DATABASE_URL"]
        self.name = self.dsn.rsplit("/", 1)[-1]
        self.token = manage(checkout, self.env, "create_api_token", "lead").split()[-1]
        self.commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        self.next_order = 1001
        self.web, self.url = procs.start_web(checkout, self.env)
        self.worker = procs.start_qcluster(
            with_app(self.dsn, WORKER_APP),
            checkout=checkout,
            base_env=self.env,
            REFUND_GATEWAY_URL=self.url + "/gateway",  # this daphne serves the demo's gateway
        )
        self.db = psycopg.connect(self.dsn, autocommit=True)  # its backend names the server

    def orders(self, n: int) -> list[str]:
        """n orders no run has used yet."""
        first, self.next_order = self.next_order, self.next_order + n
        return [f"ORD-{i}" for i in range(first, first + n)]

    def worker_pids(self) -> list[int]:
        """The q2 worker processes that run the runs (their run pools' heartbeat rows)."""
        rows = self.db.execute(
            "SELECT worker FROM agentruns_workerheartbeat WHERE worker LIKE 'pool@%%'"
        ).fetchall()
        group = group_processes(self.worker.pid)
        return sorted(p for (w,) in rows if (p := int(w.rsplit(":", 1)[1])) in group)

    def roles(self) -> dict[int, str]:
        """Each process of the qcluster: main, sentinel, worker (a run pool) or q2 (the pusher,
        the monitor)."""
        workers = set(self.worker_pids())
        out = {}
        for pid, ppid in group_processes(self.worker.pid).items():
            out[pid] = (
                "main"
                if pid == self.worker.pid
                else "sentinel"
                if ppid == self.worker.pid
                else "worker"
                if pid in workers
                else "q2"
            )
        return out

    def close(self) -> None:
        try:
            self.db.close()
            procs.stop(self.worker)
            procs.stop_web(self.web)
        finally:
            admin(f"DROP DATABASE {self.name} WITH (FORCE)")


# ---------------------------------------------------------------------------- the clients
def start_and_poll(
    dep: Deployment, orders: list[str], clients: int, poll_s: float, timeout: float = 900
) -> dict:
    """POST a run per order from `clients` threads at once, each then polling its runs until all
    succeeded: {"sent": {id: t}, "seen": {id: t}, "gets": n} (epoch seconds)."""
    import httpx

    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    gets = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()
    clients = min(clients, len(orders))
    barrier = threading.Barrier(clients)
    headers = {"Authorization": f"Bearer {dep.token}"}

    def client(mine: list[str]) -> None:
        try:
            with httpx.Client(base_url=dep.url, timeout=120, headers=headers) as http:
                barrier.wait()
                pending = []
                for order in mine:
                    body = {"agent": AGENT, "input": {"order_id": order}}
                    t = time.time()
                    answer = http.post("/api/runs", json=body)
                    if answer.status_code != 201:
                        raise RuntimeError(f"POST /api/runs: {answer.status_code} {answer.text}")
                    run_id = answer.json()["id"]
                    pending.append(run_id)
                    with lock:
                        sent[run_id] = t
                deadline = time.monotonic() + timeout
                while pending:
                    time.sleep(poll_s)
                    for run_id in list(pending):
                        status = http.get(f"/api/runs/{run_id}").json()["status"]
                        with lock:
                            gets[0] += 1
                        if status == "succeeded":
                            seen[run_id] = time.time()
                            pending.remove(run_id)
                        elif status in ("failed", "cancelled"):
                            raise RuntimeError(f"run {run_id} {status}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{len(pending)} runs unfinished after {timeout} s")
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=client, args=(orders[k::clients],), daemon=True)
        for k in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {"sent": sent, "seen": seen, "gets": gets[0]}


def finished_at(dep: Deployment, ids: list[str]) -> dict[str, float]:
    rows = dep.db.execute(
        "SELECT id::text, extract(epoch FROM finished_at) FROM agentruns_run WHERE id = ANY(%s)",
        [ids],
    ).fetchall()
    return {run_id: float(t) for run_id, t in rows}


# ---------------------------------------------------------------------------- /proc
def machine() -> tuple[list[int], int]:
    """(/proc/stat's cpu line: user nice system idle iowait irq softirq steal, ctxt)."""
    cpu, ctxt = [], 0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu "):
            cpu = [int(v) for v in line.split()[1:9]]
        elif line.startswith("ctxt "):
            ctxt = int(line.split()[1])
    return cpu, ctxt


def _switches(pid: int, tid: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return None
    return sum(
        int(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))
    )


class GroupSampler(threading.Thread):
    """Every `interval` seconds: each process of a process group, its thread count and its
    threads' context switches (counted from the first sample, or from 0 for a thread born
    since; a tid seen again with fewer switches is a new thread)."""

    def __init__(self, pgid: int, interval: float = 1.0) -> None:
        super().__init__(name="group-sampler", daemon=True)
        self.pgid, self.interval = pgid, interval
        self.stopped = threading.Event()
        self.threads: dict[int, list[int]] = defaultdict(list)
        self.base: dict[tuple[int, str], int] = {}
        self.last: dict[tuple[int, str], int] = {}
        self.switches: dict[int, int] = defaultdict(int)  # of threads gone, per process
        self.first = True

    def sample(self) -> None:
        for pid in group_processes(self.pgid):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            self.threads[pid].append(len(tids))
            for tid in tids:
                n = _switches(pid, tid)
                if n is None:
                    continue
                key = (pid, tid)
                if key not in self.base or n < self.last[key]:
                    if key in self.base:  # the tid was reused: bank the old thread's
                        self.switches[pid] += self.last[key] - self.base[key]
                    self.base[key] = n if self.first else 0
                self.last[key] = n
        self.first = False

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def start(self) -> None:
        self.sample()
        super().start()

    def stop(self) -> dict[int, dict]:
        self.stopped.set()
        self.join(10)
        self.sample()
        per: dict[int, dict] = {}
        for (pid, _), n in self.last.items():
            self.switches[pid] += n - self.base[(pid, _)]
        for pid, counts in self.threads.items():
            per[pid] = {
                "threads_max": max(counts),
                "threads_median": statistics.median(counts),
                "switches": self.switches[pid],
            }
        return per


# ---------------------------------------------------------------------------- phases
def one_alone(dep: Deployment) -> float:
    """POST -> finished_at of one run with nothing else in flight (s)."""
    got = start_and_poll(dep, dep.orders(1), 1, 0.02)
    ((run_id, sent),) = got["sent"].items()
    return finished_at(dep, [run_id])[run_id] - sent


def batch(dep: Deployment, n: int, poll_s: float) -> dict:
    """n runs started together by CLIENTS clients; what the processes spent on them."""
    roles = dep.roles()
    workers = [p for p, r in roles.items() if r == "worker"]
    backend = dep.db.execute("SELECT pg_backend_pid()").fetchone()[0]
    sampler = Sampler(dep.dsn, WORKER_APP, workers, interval=0.5)
    sampler.start()
    group = GroupSampler(dep.worker.pid)
    load0 = os.getloadavg()
    cpu_split = CpuSplit(dep.worker.pid, backend)
    web0, (stat0, ctxt0) = cpu_seconds(dep.web.pid), machine()
    group.start()
    got = start_and_poll(dep, dep.orders(n), CLIENTS, poll_s)
    per_process = group.stop()
    web1, (stat1, ctxt1) = cpu_seconds(dep.web.pid), machine()
    split = cpu_split.since()
    load1 = os.getloadavg()
    sampler.stop()
    rss, connections = sampler.peak()
    ids = list(got["sent"])
    first = min(got["sent"].values())
    done = finished_at(dep, ids)
    wall = max(done.values()) - first
    ticks = [b - a for a, b in zip(stat0, stat1, strict=True)]
    total_ticks = sum(ticks) or 1
    worker_switches = sum(v["switches"] for p, v in per_process.items() if roles.get(p) == "worker")
    group_switches = sum(v["switches"] for v in per_process.values())
    return {
        "runs": n,
        "wall_s": wall,
        "wall_polled_s": max(got["seen"].values()) - first,
        "run_latency_p50_s": pct([done[i] - got["sent"][i] for i in ids], 50),
        "posts_s": max(got["sent"].values()) - first,
        "worker_cpu_ms": split["worker (qcluster and its processes)"] * 1000 / n,
        "web_cpu_ms": (web1 - web0) * 1000 / n,
        "pg_cpu_ms": split["PostgreSQL (postmaster and backends)"] * 1000 / n,
        "clients_cpu_ms": split["starter (this process)"] * 1000 / n,
        "gets_per_run": got["gets"] / n,
        "idle_pct": 100 * (ticks[3] + ticks[4]) / total_ticks,
        "system_pct": 100 * (ticks[2] + ticks[5] + ticks[6]) / total_ticks,
        "steal_pct": 100 * ticks[7] / total_ticks,
        "worker_switches_per_s": worker_switches / wall,
        "qcluster_switches_per_s": group_switches / wall,
        "machine_switches_per_s": (ctxt1 - ctxt0) / wall,
        "threads": {
            f"{roles.get(p, '?')} {p}": {"max": v["threads_max"], "median": v["threads_median"]}
            for p, v in sorted(per_process.items())
        },
        "worker_threads_max": max(
            (v["threads_max"] for p, v in per_process.items() if roles.get(p) == "worker"),
            default=0,
        ),
        "worker_rss_mb_peak": rss,
        "worker_pg_connections_peak": connections,
        "loadavg_before": load0[0],
        "loadavg_after": load1[0],
        "ids": ids,
    }


def run_shape(dep: Deployment, ids: list[str]) -> dict:
    """Per run: its steps by kind, its `model.delta` events, and per model turn the text
    deltas the scripted model streamed and the tools it called (medians over `ids`)."""
    counts = dep.db.execute(
        "SELECT r.id::text, "
        "(SELECT count(*) FROM agentruns_step s WHERE s.run_id = r.id AND s.kind = 'model'), "
        "(SELECT count(*) FROM agentruns_step s WHERE s.run_id = r.id AND s.kind <> 'model'), "
        "(SELECT count(*) FROM agentruns_runevent e WHERE e.run_id = r.id "
        "AND e.type = 'model.delta'), "
        "(SELECT count(*) FROM agentruns_runevent e WHERE e.run_id = r.id) "
        "FROM agentruns_run r WHERE r.id = ANY(%s)",
        [ids],
    ).fetchall()
    turns: dict[str, list] = defaultdict(list)
    for run_id, text, calls in dep.db.execute(
        "SELECT run_id::text, text, tool_calls FROM agentruns_step "
        "WHERE run_id = ANY(%s) AND kind = 'model' ORDER BY run_id, index",
        [ids],
    ).fetchall():
        names = [c.get("name") or c.get("function", {}).get("name") for c in calls or []]
        turns[run_id].append((len(_TOKEN.findall(text or "")), names))
    shapes = Counter(json.dumps(t) for t in turns.values())
    return {
        "model_steps": statistics.median(r[1] for r in counts),
        "tool_steps": statistics.median(r[2] for r in counts),
        "model_delta_events": statistics.median(r[3] for r in counts),
        "model_delta_events_min_max": [min(r[3] for r in counts), max(r[3] for r in counts)],
        "events": statistics.median(r[4] for r in counts),
        "text_deltas": statistics.median(sum(n for n, _ in t) for t in turns.values()),
        "turns": json.loads(shapes.most_common(1)[0][0]),  # the most common shape
        "shapes_seen": len(shapes),
    }


def case(checkout: Path, label: str, args: argparse.Namespace, profile: bool) -> dict:
    orders = WARMUP_RUNS + ALONE_RUNS + args.runs * (2 if profile else 1) + args.streaming_runs
    dep = Deployment(checkout, label, args.token_ms, orders + 10)
    try:
        for _ in range(WARMUP_RUNS):
            one_alone(dep)
        alone = [one_alone(dep) for _ in range(ALONE_RUNS)]
        time.sleep(1)
        out: dict = {"checkout": str(checkout), "commit": dep.commit}
        out["one_run_s"] = statistics.median(alone)
        out["one_run_all_s"] = alone
        out["batch"] = batch(dep, args.runs, args.poll_ms / 1000)
        out["batch"]["over_one"] = out["batch"]["wall_s"] / out["one_run_s"]
        out["shape"] = run_shape(dep, out["batch"].pop("ids"))
        if args.streaming_runs:
            time.sleep(1)
            out["streaming"] = batch(dep, args.streaming_runs, args.poll_ms / 1000)
            out["streaming"]["over_one"] = out["streaming"]["wall_s"] / out["one_run_s"]
            out["streaming"].pop("ids")
        if profile:
            time.sleep(1)
            out["profile"] = profiled_batch(dep, args.runs, args.poll_ms / 1000, label)
    finally:
        dep.close()
    return out


# ---------------------------------------------------------------------------- the floor
def bare_loop(shape: list | None, runs: int) -> dict:
    """benchmarks/bare_loop.py in a process of its own (nothing else in it takes CPU)."""
    cmd = [sys.executable, "-m", "benchmarks.bare_loop", "--runs", str(runs)]
    if shape:
        cmd += ["--shape", json.dumps(shape)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the profile
PROFILE_SHARES = (
    ("psycopg (driver)", "psycopg"),
    ("Django DB layer (ORM, transactions)", "django/db"),
    ("pydantic-ai", "pydantic_ai/"),
    ("pydantic / pydantic-core (validation, serialization)", "pydantic"),
    ("asyncio", "asyncio/"),
    ("threading (locks, conditions, queues)", "threading.py"),
    ("json", "json/"),
    ("logging", "logging/"),
    ("django-q2", "django_q"),
    ("agentruns (the engine and its app)", "agentruns/"),
    ("agentruns/runtime", "agentruns/runtime/"),
    ("the scripted model (engine_messages, policy)", "scripted_model"),
    ("httpx (the gateway call)", "httpx"),
)


def _entry(frames: tuple[str, ...]) -> str:
    """What the sampled thread runs: the function its thread's body (or Thread.run) called."""
    names = [f for f in frames if not f.startswith("process ")]
    for i, frame in enumerate(names[:-1]):
        if frame.startswith(("ProcessThreads.start.<locals>.body ", "Thread.run ")):
            if not names[i + 1].startswith("ProcessThreads.start.<locals>.body "):
                return names[i + 1]
    return names[0] if names else "?"


def profiled_batch(dep: Deployment, n: int, poll_s: float, label: str) -> dict:
    from benchmarks.profile_worker import RATE, attach_pyspy, stop_all

    PERF.mkdir(parents=True, exist_ok=True)
    stem = PERF / f"deployment-{label}-{dep.commit}-{time.strftime('%Y%m%d-%H%M%S')}"
    raw = stem.with_suffix(".collapsed.txt")
    roles = dep.roles()
    spy = attach_pyspy(dep.worker.pid, raw, stem.with_suffix(".py-spy.log"))
    time.sleep(2)  # py-spy attached to every process of the cluster
    try:
        cpu0 = group_cpu(dep.worker.pid)
        got = start_and_poll(dep, dep.orders(n), CLIENTS, poll_s)
        cpu = group_cpu(dep.worker.pid) - cpu0
    finally:
        stop_all([spy], [])
    stacks = flamegraph.read_stacks(raw)
    flamegraph.write_svg(stacks, stem.with_suffix(".svg"), f"qcluster of {label}: {n} runs")
    inclusive, own, total = flamegraph.top_costs(stacks, limit=60)
    # with --subprocesses a child's stacks sit under its parents' "process <pid>:..." frames
    inclusive = [(f, c) for f, c in inclusive if not f.startswith("process ")][:40]
    own = own[:40]
    by_process: Counter = Counter()
    for frames, count in stacks.items():
        pids = [int(m.group(1)) for f in frames if (m := re.match(r"process (\d+):", f))]
        pid = pids[-1] if pids else 0
        by_process[f"{roles.get(pid, '?')} {pid}"] += count
    entries: Counter = Counter()
    for frames, count in stacks.items():
        entries[_entry(frames)] += count
    wall = max(got["seen"].values()) - min(got["sent"].values())
    return {
        "cpu_seconds": cpu,
        "collapsed": str(raw),
        "svg": str(stem.with_suffix(".svg")),
        "rate_hz": RATE,
        "samples": total,
        "gil_seconds": total / RATE,
        "wall_polled_s": wall,
        "by_process": dict(by_process.most_common()),
        "by_thread_entry": dict(entries.most_common(12)),
        "shares": {k: flamegraph.share(stacks, needle) for k, needle in PROFILE_SHARES},
        "own": own,
        "cumulative": inclusive,
    }


# ---------------------------------------------------------------------------- report
ROWS = (  # (label, batch key, format)
    ("wall time (s)", "wall_s", "{:.2f}"),
    ("against one run alone", "over_one", "{:.1f}x"),
    ("last POST sent after (s)", "posts_s", "{:.2f}"),
    ("a run's POST -> finished, p50 (s)", "run_latency_p50_s", "{:.2f}"),
    ("**worker CPU per run (qcluster process group), ms**", "worker_cpu_ms", "{:.1f}"),
    ("worker CPU per run / bare loop", "over_floor", "{:.2f}x"),
    ("daphne CPU per run (POST, polling GETs, gateway), ms", "web_cpu_ms", "{:.1f}"),
    ("PostgreSQL CPU per run (postmaster + backends), ms", "pg_cpu_ms", "{:.1f}"),
    ("clients CPU per run (this harness), ms", "clients_cpu_ms", "{:.1f}"),
    ("GETs per run (polling)", "gets_per_run", "{:.1f}"),
    ("machine idle CPU during the batch", "idle_pct", "{:.0f}%"),
    ("machine system CPU during the batch", "system_pct", "{:.0f}%"),
    (
        "context switches/s, worker processes' threads (lower bound)",
        "worker_switches_per_s",
        "{:,.0f}",
    ),
    ("context switches/s, whole machine", "machine_switches_per_s", "{:,.0f}"),
    ("threads per worker process (max)", "worker_threads_max", "{:.0f}"),
    ("worker RSS peak (MB)", "worker_rss_mb_peak", "{:.0f}"),
    ("worker PostgreSQL connections peak", "worker_pg_connections_peak", "{:.0f}"),
    ("load average (1 min) at the start", "loadavg_before", "{:.1f}"),
)


def _cell(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    mid = fmt.format(statistics.median(values))
    if len(values) == 1:
        return mid
    return f"{mid} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def table(results: dict, floor: list[dict], args: argparse.Namespace) -> str:
    """A and B side by side with B/A; B alone when no A ran."""
    a, b = results["a"], results["b"]
    both = bool(a)
    blank = "| | | |" if both else "| |"
    head = (
        (f"| | A {a[0]['commit']} ({a[0]['checkout']}) " if both else "| ")
        + f"| B {b[0]['commit']} ({b[0]['checkout']}) "
        + ("| B/A |\n|---|---:|---:|---:|" if both else "|\n|---|---:|")
    )

    def row(label: str, get, fmt: str) -> str:
        vb = [v for r in b if (v := get(r)) is not None]
        if not both:
            return f"| {label} | {_cell(vb, fmt)} |"
        va = [v for r in a if (v := get(r)) is not None]
        ratio = (
            f"{statistics.median(vb) / statistics.median(va):.2f}"
            if va and vb and statistics.median(va)
            else "-"
        )
        return f"| {label} | {_cell(va, fmt)} | {_cell(vb, fmt)} | {ratio} |"

    lines = [head, row("one run alone (s)", lambda r: r["one_run_s"], "{:.2f}")]
    for phase, n in (("batch", args.runs), ("streaming", args.streaming_runs)):
        if not n:
            continue
        lines.append(f"| ***{n} runs started together by {CLIENTS} clients*** {blank}")
        for label, key, fmt in ROWS:
            lines.append(row(label, lambda r, p=phase, k=key: r.get(p, {}).get(k), fmt))
    lines.append(f"| ***per run (median)*** {blank}")
    for label, key in (
        ("model steps", "model_steps"),
        ("tool steps", "tool_steps"),
        ("`model.delta` events", "model_delta_events"),
        ("all events", "events"),
        ("text deltas streamed by the model", "text_deltas"),
    ):
        lines.append(row(label, lambda r, k=key: r["shape"][k], "{:.0f}"))
    lines.append(
        "| bare loop CPU per run, ms (same agent shape, no durability; same for A and B) | "
        + _cell([f["cpu_ms_per_run"] for f in floor], "{:.1f}")
        + (" | | |" if both else " |")
    )
    if all("passthrough_cpu_ms_per_run" in f for f in floor):
        lines.append(
            "| the same with Pydantic AI's durable hooks and nothing recorded (`PassThroughDurability`), ms | "
            + _cell([f["passthrough_cpu_ms_per_run"] for f in floor], "{:.1f}")
            + (" | | |" if both else " |")
        )
    return "\n".join(lines)


def profile_report(prof: dict) -> str:
    lines = [
        f"py-spy --gil on B's qcluster (all its processes) during one more batch: "
        f"{prof['samples']} samples at {prof['rate_hz']} Hz = {prof['gil_seconds']:.1f} s "
        f"holding a GIL, over {prof['wall_polled_s']:.1f} s, while the qcluster used "
        f"{prof['cpu_seconds']:.1f} s of CPU (GIL held / CPU = "
        f"{prof['gil_seconds'] / max(prof['cpu_seconds'], 1e-9):.2f}: above 1, a thread held "
        f"its process's GIL while it waited for a core); collapsed stacks: "
        f"{prof['collapsed']}, flame graph: {prof['svg']}",
        "",
        "Samples by process: "
        + ", ".join(f"{k} {v / prof['samples']:.1%}" for k, v in prof["by_process"].items()),
        "",
        "| by thread (what its body runs) | share |",
        "|---|---:|",
        *(f"| `{k}` | {v / prof['samples']:.1%} |" for k, v in prof["by_thread_entry"].items()),
        "",
        "| in the stack (cumulative share) | share |",
        "|---|---:|",
        *(f"| {k} | {v:.1%} |" for k, v in prof["shares"].items()),
        "",
        "| # | top functions by own samples | own |",
        "|---:|---|---:|",
        *(
            f"| {i} | `{f}` | {c / prof['samples']:.1%} |"
            for i, (f, c) in enumerate(prof["own"], 1)
        ),
        "",
        "| # | top functions by cumulative samples | cumulative |",
        "|---:|---|---:|",
        *(
            f"| {i} | `{f}` | {c / prof['samples']:.1%} |"
            for i, (f, c) in enumerate(prof["cumulative"], 1)
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, help="the baseline checkout (none: B alone)")
    parser.add_argument("--b", type=Path, default=ROOT, help="the checkout under test")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--streaming-runs", type=int, default=0, help="a second batch (e.g. 200)")
    parser.add_argument("--token-ms", type=float, default=15, help="SCRIPTED_MODEL_DELAY_MS")
    parser.add_argument("--poll-ms", type=float, default=200, help="each client's polling pause")
    parser.add_argument("--floor-runs", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="py-spy on B's qcluster")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--write-docs", action="store_true", help="its docs/BENCHMARKS.md section")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    results: dict[str, list[dict]] = {"a": [], "b": []}
    floor: list[dict] = []
    sides = ("a", "b") if args.a else ("b",)
    for round_ in range(args.rounds):
        for side in sides if round_ % 2 == 0 else sides[::-1]:
            profile = args.profile and side == "b" and round_ == args.rounds - 1
            checkout = getattr(args, side).resolve()
            print(f"round {round_ + 1}: {side.upper()} {checkout} ...", flush=True)
            got = case(checkout, side.upper(), args, profile)
            results[side].append(got)
            print(
                f"round {round_ + 1} {side.upper()}: one run {got['one_run_s']:.2f} s; "
                f"{args.runs} runs {got['batch']['wall_s']:.2f} s "
                f"({got['batch']['over_one']:.1f}x); worker {got['batch']['worker_cpu_ms']:.1f}"
                f" ms/run, daphne {got['batch']['web_cpu_ms']:.1f}, PostgreSQL "
                f"{got['batch']['pg_cpu_ms']:.1f}; idle {got['batch']['idle_pct']:.0f}%; "
                f"load {got['batch']['loadavg_before']:.1f}",
                flush=True,
            )
        floor.append(bare_loop(results["b"][-1]["shape"]["turns"], args.floor_runs))
        print(f"round {round_ + 1}: bare loop {floor[-1]['cpu_ms_per_run']:.1f} ms/run", flush=True)
        for side in sides:
            got = results[side][-1]
            for phase in ("batch", "streaming"):
                if phase in got:
                    got[phase]["over_floor"] = (
                        got[phase]["worker_cpu_ms"] / floor[-1]["cpu_ms_per_run"]
                    )
    method = (
        f"Demo `refund` agent through daphne + one qcluster (defaults), scripted model at "
        f"{args.token_ms:g} ms a token; {args.rounds} round(s), median (min-max); "
        f"machine: {os.cpu_count()} cores, load average now "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
    )
    print()
    print(method)
    print()
    print(table(results, floor, args))
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section(
            "deployment",
            "## Through the real deployment: what a run costs (issue 43)\n\n"
            'Command: `PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m '
            "benchmarks.deployment [--a <baseline checkout>]` (part of `make bench`, with "
            "`--a $BENCH_BASELINE` when given); method in `benchmarks/deployment.py`. "
            f"{method}.\n\n{table(results, floor, args)}\n",
        )
    shape = results["b"][-1]["shape"]
    print()
    print(
        "Per model turn (B, most common shape; "
        f"{shape['shapes_seen']} shape(s) seen): "
        + "; ".join(f"{n} text deltas, tools {t or '-'}" for n, t in shape["turns"])
    )
    for side in sides:
        print(
            f"threads ({side.upper()}, last round, {args.runs} runs): "
            + ", ".join(
                f"{k}: max {v['max']}, median {v['median']:.0f}"
                for k, v in results[side][-1]["batch"]["threads"].items()
            )
        )
    prof = results["b"][-1].get("profile")
    if prof:
        print()
        print(profile_report(prof))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args), "results": results, "floor": floor}, indent=1, default=str
            )
        )
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
