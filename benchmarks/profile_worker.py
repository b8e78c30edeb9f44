"""Where a run's time and CPU go on the latency-bound path: POST /api/runs to the first model
call (HTTP, run insert, doorbell, q2 pick-up, hand-over, claim), then per step, with py-spy
flame graphs of the real web and worker processes (issue 22, item 1).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.profile_worker \
        [--workload sleeping|streaming] [--light 30] [--burst 200] [--out docs/perf]

Two phases, each with fresh processes: `light` (one POST every 0.3 s: the path without
contention) and `burst` (N runs POSTed at once by 8 clients: the latency-bound batch of
`benchmarks.inflight`). Each phase runs daphne and `qcluster` (its defaults: 2 worker processes)
under `benchmarks/probes.py`, which timestamps the hand-offs of every run in those processes;
after a warm-up, `py-spy record --pid --subprocesses --gil --nonblocking` attaches to both
(`--gil`: only the thread holding the interpreter lock is sampled, so the samples are Python
CPU time; a thread waiting on the model or the database is not sampled). Writes, per phase,
`<out>/<workload>-<phase>-<runs>-worker.svg` and `-web.svg` (flame graphs), and prints the
breakdown (medians over the runs) and the top costs; `--markdown` also writes
`<out>/<workload>-<phase>-<runs>.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import cpu_split, flamegraph
from benchmarks.cpu_split import CpuSplit
from benchmarks.inflight import TOKEN_MS, TURN_MS, dsn, setup
from benchmarks.procs import QUOTAS_OFF_THE_WAY

ROOT = Path(__file__).resolve().parent.parent
PYSPY = str(Path(sys.executable).parent / "py-spy")
RATE = 200  # samples a second per process
CLIENTS = 8
WORKLOADS = {
    "sleeping": (
        "bench-refund",
        {"SCRIPTED_MODEL_LATENCY_MS": TURN_MS, "SCRIPTED_MODEL_DELAY_MS": 0},
    ),
    "streaming": (
        "bench-stream",
        {"SCRIPTED_MODEL_LATENCY_MS": 0, "SCRIPTED_MODEL_DELAY_MS": TOKEN_MS},
    ),
}
ROLES = (  # where a worker's CPU goes, by the thread or process a sample is in
    ("runs (RunPool._work: threads, or tasks of the process's loop)", "RunPool._work"),
    ("q2 pusher (doorbells off the broker)", "pusher (django_q"),
    ("q2 worker task loops (hand-overs)", "worker (django_q"),
    ("q2 monitor (task results)", "monitor (django_q"),
    ("sweeper + heartbeat", "SweeperLoop.run"),
    ("lease keeper", "_LeaseKeeper"),
)
SEGMENTS = (  # (label, from point, to point): the start path, in order
    ("HTTP in: parse, auth, validation, snapshot", "sent", "insert"),
    ("run insert", "insert", "inserted"),
    ("doorbell (q2 task row)", "inserted", "doorbell"),
    ("commit + HTTP response", "doorbell", "responded"),
    ("q2 pick-up: NOTIFY, pusher, task queue (to the hand-over taken)", "doorbell", "hand_over"),
    ("hand-over: job queue to the run's thread", "hand_over", "claim"),
    ("claim (lease + running events)", "claim", "claimed"),
    ("claimed -> first model call (load run, agent, tools)", "claimed", "model_call"),
    ("total: POST -> first model call", "sent", "model_call"),
)


def model_wait_s(workload: str) -> float:
    """How long one model turn of the workload keeps a run waiting on the model."""
    from benchmarks.workload import STREAM_TOKENS_PER_TURN

    if workload == "streaming":
        return STREAM_TOKENS_PER_TURN * TOKEN_MS / 1000
    return TURN_MS / 1000


def start_probed(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """`benchmarks.probes` running daphne or qcluster, in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.probes", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def attach_pyspy(pid: int, out: Path, log: Path) -> subprocess.Popen:
    """py-spy on a running process and its children, sampling only the thread that holds the
    GIL (`--gil`: Python CPU time; a thread waiting on the model, the database or a lock is not
    sampled), without pausing the process (`--nonblocking`)."""
    cmd = [PYSPY, "record", "--pid", str(pid), "--subprocesses", "--gil", "--nonblocking"]
    return subprocess.Popen(
        [*cmd, "-r", str(RATE), "-f", "raw", "-o", str(out)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def stop_all(spies: list[subprocess.Popen], procs: list[subprocess.Popen]) -> None:
    """SIGINT to each py-spy (it writes its samples and ends), then SIGKILL the processes."""
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def start_in_process(agent: str, count: int) -> dict:
    """`--start service`: the runs started by `services.start_run` from 8 threads of this
    process, as `benchmarks.inflight` starts its batches (no HTTP: starts 5-10x faster);
    {run id: (called, returned)} in epoch seconds."""
    from django.db import connection

    from agentruns.services import start_run

    def one(i: int) -> tuple[str, tuple[float, float]]:
        try:
            called = time.time()
            run = start_run(agent, {"order_id": f"ORD-{1001 + i % 250}"}).run
            return str(run.id), (called, time.time())
        finally:
            connection.close()

    with ThreadPoolExecutor(CLIENTS) as pool:
        return dict(pool.map(one, range(count)))


def post_runs(base_url: str, token: str, agent: str, count: int, together: bool) -> dict:
    """POST the runs; {run id: (sent, responded)} in epoch seconds."""
    import httpx

    times: dict[str, tuple[float, float]] = {}

    def one(i: int, http: httpx.Client) -> None:
        body = {"agent": agent, "input": {"order_id": f"ORD-{1001 + i % 250}"}}
        sent = time.time()
        reply = http.post("/api/runs", json=body, headers={"Authorization": f"Bearer {token}"})
        reply.raise_for_status()
        times[reply.json()["id"]] = (sent, time.time())

    if together:
        clients = [httpx.Client(base_url=base_url, timeout=60) for _ in range(CLIENTS)]
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(lambda i: one(i, clients[i % CLIENTS]), range(count)))
        for c in clients:
            c.close()
    else:
        with httpx.Client(base_url=base_url, timeout=60) as http:
            for i in range(count):
                one(i, http)
                time.sleep(0.3)
    return times


def breakdown(probe_file: Path, times: dict, model_wait_s: float) -> dict:
    points: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    dequeues = []
    gc_of: dict[int, dict] = {}  # per worker process: its last (cumulative) collector row
    pool_of: dict[int, dict] = {}  # ... and its psycopg pool's counters
    for line in probe_file.read_text().splitlines():
        row = json.loads(line)
        if row["at"] == "dequeued":
            dequeues.append(row["n"])
        elif row["at"] == "gc":
            gc_of[row["pid"]] = row
        elif row["at"] == "pool":
            pool_of[row["pid"]] = row
        elif row["run"] in times:
            points[row["run"]][row["at"]].append(row)
    segments: dict[str, list[float]] = defaultdict(list)
    model_gaps, tool_gaps, cpu, handovers, requeued = [], [], [], [], []
    for run_id, (sent, responded) in times.items():
        p = points[run_id]
        at = {k: v[0]["t"] for k, v in p.items()}
        # a run handed over to a full process is re-rung (and the sweeper may ring a running
        # one): the hand-over that led to the claim is the last one before it
        if p["hand_over"] and "claimed" in at:
            before = [h["t"] for h in p["hand_over"] if h["t"] <= at["claimed"]]
            at["hand_over"] = max(before) if before else at["hand_over"]
        handovers.append(len(p["hand_over"]))
        requeued.append(sum(1 for h in p["handed"] if h.get("result") == "requeued"))
        at.update(sent=sent, responded=responded)
        for label, a, b in SEGMENTS:
            if a in at and b in at:
                segments[label].append((at[b] - at[a]) * 1000)
        starts = sorted(
            [("model", r["t"]) for r in p["model_call"]]
            + [("tool", r["t"]) for r in p["tool_call"]],
            key=lambda s: s[1],
        )
        ends = [r["t"] for r in p["advanced"]]
        bounds = [t for _, t in starts[1:]] + ends[-1:]
        for (kind, t), nxt in zip(starts, bounds, strict=False):
            if kind == "model":
                model_gaps.append((nxt - t - model_wait_s) * 1000)
            else:
                tool_gaps.append((nxt - t) * 1000)
        if p["advance"] and p["advanced"] and "cpu" in p["advanced"][0]:  # (a run's own thread)
            cpu.append(sum(e["cpu"] for e in p["advanced"]) - sum(b["cpu"] for b in p["advance"]))
    result = {
        label: {"p50": statistics.median(v), "p90": sorted(v)[int(0.9 * (len(v) - 1))], "n": len(v)}
        for label, v in segments.items()
    }
    # the refund's tool calls run in their model turn's commit (planned_steps): a turn's gap
    # to the next one is the model's wait + the engine's commit + those calls
    result["per model turn beyond the model's wait (incl. the calls run in its commit)"] = _stat(
        model_gaps
    )
    if tool_gaps:
        result["per tool step run on its own"] = _stat(tool_gaps)
    result["executor CPU per run (its thread)"] = _stat([c * 1000 for c in cpu])
    result["hand-overs per run (mean; re-rung or rung again by the sweeper)"] = {
        "p50": statistics.fmean(handovers) if handovers else 0.0,
        "p90": max(handovers, default=0),
        "n": len(handovers),
    }
    result["hand-overs refused per run (mean; no free slot: re-rung)"] = {
        "p50": statistics.fmean(requeued) if requeued else 0.0,
        "p90": max(requeued, default=0),
        "n": len(requeued),
    }
    result["doorbells per pusher dequeue (mean)"] = {
        "p50": statistics.fmean(dequeues) if dequeues else 0.0,
        "p90": max(dequeues, default=0),
        "n": len(dequeues),
    }
    if gc_of and times:  # the collector pauses every thread of its process while it runs
        gc_s = [sum(r["seconds"][g] for r in gc_of.values()) for g in range(3)]
        full = sum(r["counts"][2] for r in gc_of.values())
        result[
            "cyclic GC per run, all generations (p90 column: full collections only; n: those)"
        ] = {
            "p50": sum(gc_s) * 1000 / len(times),
            "p90": gc_s[2] * 1000 / len(times),
            "n": full,
        }
    if pool_of and times:
        asked = sum(r["requests_num"] for r in pool_of.values())
        waited = sum(r["requests_queued"] for r in pool_of.values())
        wait_ms = sum(r["requests_wait_ms"] for r in pool_of.values())
        result["pool connections per run (p90 column: of those, waited for one)"] = {
            "p50": asked / len(times),
            "p90": waited / len(times),
            "n": len(pool_of),
        }
        result["waiting for a pooled connection per run, ms (p90 column: per wait)"] = {
            "p50": wait_ms / len(times),
            "p90": wait_ms / waited if waited else 0.0,
            "n": waited,
        }
    return result


def _stat(values: list[float]) -> dict:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "n": 0}
    return {
        "p50": statistics.median(values),
        "p90": sorted(values)[int(0.9 * (len(values) - 1))],
        "n": len(values),
    }


def wait_finished(ids: list[str], timeout: float = 600) -> None:
    from agentruns.models import Run

    deadline = time.monotonic() + timeout
    while Run.objects.filter(id__in=ids, status="succeeded").count() < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError("the profiled runs did not finish")
        time.sleep(0.1)


def phase(
    workload: str,
    name: str,
    count: int,
    out: Path,
    tmp: Path,
    token: str,
    via: str = "http",
    spy: bool = True,
) -> str:
    from django.db import connection

    from tests.procs import free_port, wait_http

    agent, model_env = WORKLOADS[workload]
    probe_file = tmp / f"{name}.jsonl"
    env = {**os.environ, "DATABASE_URL": dsn().replace("postgresql://", "postgres://", 1)}
    env.update({k: str(v) for k, v in model_env.items()})
    env.update(PROBE_FILE=str(probe_file), LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    # 200 POSTs at once outran the start quota's burst of 100 (429) once the web was quick
    env.update(QUOTAS_OFF_THE_WAY)
    port = free_port()
    service = via == "service" and name == "burst"
    stem = out / f"{workload}-{name}-{count}{'-service' if service else ''}"
    raw_web, raw_worker = tmp / f"{name}-web.txt", tmp / f"{name}-worker.txt"
    web = start_probed(
        ["web", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"], env, tmp / "web.log"
    )
    worker = start_probed(["worker"], env, tmp / "worker.log")
    base_url = f"http://127.0.0.1:{port}"
    spies: list[subprocess.Popen] = []
    try:
        wait_http(base_url + "/healthz", timeout=60)
        time.sleep(4)
        wait_finished(list(post_runs(base_url, token, agent, 8, together=True)))  # warm-up
        # sampled from here: start-up and warm-up are not part of the profile
        spies = (
            [
                attach_pyspy(web.pid, raw_web, tmp / "py-spy.log"),
                attach_pyspy(worker.pid, raw_worker, tmp / "py-spy.log"),
            ]
            if spy
            else []
        )
        time.sleep(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            cpu = CpuSplit(worker.pid, cursor.fetchone()[0])
        statements = cpu_split.StatementCounts()  # when the server preloads pg_stat_statements
        started = time.time()
        if service:
            from benchmarks import probes

            os.environ["PROBE_FILE"] = str(probe_file)  # this process's starts are probed too
            probes.install_web()
            times = start_in_process(agent, count)
        else:
            times = post_runs(base_url, token, agent, count, together=name == "burst")
        wait_finished(list(times))
        finished = time.time()
        cpu_s = cpu.since()
        top = statements.top(count)
        wall = max(times.values())[1] - started
    finally:
        stop_all(spies, [web, worker])
    table = breakdown(probe_file, times, model_wait_s(workload))
    lines = [
        f"### {workload}, {name}: {count} runs "
        + (
            "started at once by 8 threads (services.start_run, no HTTP)"
            if service
            else "POSTed at once by 8 clients"
            if name == "burst"
            else "POSTed one every 0.3 s"
        ),
        "",
        f"1-minute load average {os.getloadavg()[0]:.1f}; POSTs took {wall:.1f} s; "
        f"the batch {finished - started:.1f} s.",
        "",
        "CPU during the batch (its floor on 2 cores: the sum / 2): "
        + ", ".join(f"{k} {v:.1f} s ({v * 1000 / count:.1f} ms a run)" for k, v in cpu_s.items())
        + f"; sum {sum(cpu_s.values()):.1f} s, floor {sum(cpu_s.values()) / 2:.1f} s"
        + ("" if spy else "; no py-spy attached"),
        "",
        *top,
        "| segment | p50 (ms) | p90 (ms) | runs |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {k} | {v['p50']:.1f} | {v['p90']:.1f} | {v['n']} |" for k, v in table.items()]
    for role, raw in (("worker", raw_worker), ("web", raw_web)) if spy else ():
        stacks = flamegraph.read_stacks(raw)
        flamegraph.write_svg(
            stacks, stem.with_name(stem.name + f"-{role}.svg"), f"{role}: {workload}, {name}"
        )
        inclusive, own, total = flamegraph.top_costs(stacks, only="agentruns/")
        _, own_all, _ = flamegraph.top_costs(stacks)
        lines += [
            "",
            f"{role} process(es): {total} GIL-holding samples at {RATE}/s ({total / RATE:.1f} s holding the GIL); "
            + ", ".join(
                f"{k} {flamegraph.share(stacks, n):.0%}"
                for k, n in (
                    ("psycopg", "psycopg"),
                    ("Django DB layer", "django/db"),
                    ("django-q2", "django_q"),
                    ("json", "json/"),
                    ("pickle/signing", "signing"),
                    ("logging", "logging/"),
                )
            ),
            "",
            *(
                [
                    "| where (worker) | share of samples |",
                    "|---|---:|",
                    *(f"| {k} | {flamegraph.share(stacks, n):.1%} |" for k, n in ROLES),
                    "",
                ]
                if role == "worker"
                else []
            ),
            "| top agentruns frames (inclusive) | share |",
            "|---|---:|",
        ]
        lines += [f"| `{f}` | {c / total:.1%} |" for f, c in inclusive[:10]]
        lines += ["", "| top frames (self) | share |", "|---|---:|"]
        lines += [f"| `{f}` | {c / total:.1%} |" for f, c in own_all[:10]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="sleeping")
    parser.add_argument("--light", type=int, default=30)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "docs" / "perf"))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--start",
        choices=["http", "service"],
        default="http",
        help="burst: POST /api/runs (default) or services.start_run from 8 threads",
    )
    parser.add_argument(
        "--no-pyspy",
        action="store_true",
        help="no flame graphs: py-spy's sampling of ~1000 threads takes CPU from the batch",
    )
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    setup()
    from django.contrib.auth import get_user_model

    from agentruns.tokens import create_token

    token = create_token(get_user_model().objects.get(username="lead"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        for name, count in (("light", args.light), ("burst", args.burst)):
            if not count:
                continue
            text = phase(
                args.workload, name, count, out, Path(tmp), token, args.start, not args.no_pyspy
            )
            print(text, flush=True)
            if args.markdown:
                suffix = "-service" if args.start == "service" and name == "burst" else ""
                (out / f"{args.workload}-{name}-{count}{suffix}.md").write_text(text)


if __name__ == "__main__":
    main()
