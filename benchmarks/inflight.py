"""Latency-bound load, side by side, and the start latency (issue 12; part of `make bench`).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.inflight [--write-docs]

Latency-bound: N runs of the seven-step refund flow (benchmarks/workload.py) started together by
8 concurrent clients, in two workloads:
- sleeping: every model turn waits TURN_MS like a real model's time to first token
  (SCRIPTED_MODEL_LATENCY_MS for ours), then answers at once; N = 1, 50, 200 and, for ours
  only, 1000 (the peers at 1000 would add minutes and no target names them);
- streaming: every model turn streams STREAM_TOKENS_PER_TURN tokens, one every TOKEN_MS (50 a
  second per run: SCRIPTED_MODEL_DELAY_MS for ours, which persists them as `model.delta` events
  every AGENTRUNS_DELTA_FLUSH_MS; the peers only wait for theirs), N = 1 and 200, on
  PostgreSQL + Redis; while the batch runs a probe client starts a few more runs through the
  real web process (POST /api/runs) and times the first `model.delta` frame on their WebSocket.
Ours runs through the real worker: one `qcluster` with its defaults (2 q2 worker processes,
AGENTRUNS_RUNS_PER_PROCESS). The peers (`benchmarks/peers_inflight.py`) get the same in-flight
concurrency and as many pooled database connections. Wall time runs from the first start to the
last finish; RSS is the largest worker process's (ours: a q2 worker; a peer: its one process),
growth against the same process before the batch; connections are those the system under test
holds (by application_name).

Start latency: POST /api/runs -> the run's first `model.delta` frame on its WebSocket, a fresh
run at a time (the socket is opened when the POST returns, and replays from seq 0), on
PostgreSQL + Redis and on the SQLite default with its database poll.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import procs
from benchmarks.first_delta import SocketProbe, first_delta_from_db, start_latency
from benchmarks.sampling import pct
from tests import binaries

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("AGENTRUNS_AGENT_MODULES", "benchmarks.workload")
os.environ.setdefault("LOG_LEVEL", "WARNING")

TURN_MS = 500
NS = (1, 50, 200)
OURS_ONLY_NS = (1000,)  # the sleeping workload's N=1000, ours only
STREAM_NS = (1, 200)
TOKEN_MS = 20  # 50 tokens a second per run
CLIENTS = 8
WORKER_APP = "agentruns-worker"
QUICK = bool(os.environ.get("BENCH_QUICK"))


def setup() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=250, stdout=devnull)


def dsn() -> str:
    return os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)


# ---------------------------------------------------------------------------- ours
def start_qcluster(**env: object) -> subprocess.Popen:
    from benchmarks.procs import start_qcluster as start
    from benchmarks.sampling import with_app

    return start(with_app(os.environ["DATABASE_URL"], WORKER_APP), **env)


def start_together(n: int, agent: str = "bench-refund") -> tuple[list, float]:
    """n runs of `agent` from CLIENTS threads; returns (ids, wall-clock start)."""
    from django.db import connection

    from agentruns.services import start_run

    def one(i: int):
        try:
            return start_run(agent, {"order_id": f"ORD-{1001 + i % 250}"}).run.id
        finally:
            connection.close()

    started = time.time()
    with ThreadPoolExecutor(CLIENTS) as clients:
        return list(clients.map(one, range(n))), started


def wait_done(ids: list, timeout: float = 300) -> float:
    """When (epoch seconds) the last of `ids` finished, once all of them succeeded."""
    from django.db.models import Max

    from agentruns.models import Run

    deadline = time.monotonic() + timeout
    while Run.objects.filter(id__in=ids, status="succeeded").count() < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError("the latency-bound batch did not finish")
        time.sleep(0.05)
    return Run.objects.filter(id__in=ids).aggregate(m=Max("finished_at"))["m"].timestamp()


def ours_latency_bound(ns: tuple[int, ...], workload: dict) -> tuple[list[dict], dict]:
    from agentruns.conf import conf
    from agentruns.models import WorkerHeartbeat
    from benchmarks.sampling import Sampler

    agent, web = workload["agent"], workload.get("web")
    proc = start_qcluster(**workload["env"])
    rows = []
    try:
        time.sleep(3)
        for _ in range(2):  # warm up both worker processes: imports, pools, plans
            wait_done(start_together(8, agent)[0])
        pids = [
            int(name.rsplit(":", 1)[1])
            for name in WorkerHeartbeat.objects.filter(worker__startswith="pool@").values_list(
                "worker", flat=True
            )
        ]
        sampler = Sampler(dsn(), WORKER_APP, pids)
        sampler.start()
        for n in ns:
            time.sleep(1)
            sampler.reset()
            time.sleep(0.2)
            baseline = sampler.peak()[0]
            probe = SocketProbe(web[0], web[1], agent) if web else None
            if probe:
                probe.start()
            ids, started = start_together(n, agent)
            wall = wait_done(ids) - started
            rss, connections = sampler.peak()
            row = {
                "n": n,
                "wall_s": wall,
                "rss_mb": rss,
                "rss_growth_mb": rss - baseline,
                "pg_connections": connections,
            }
            if workload.get("tokens"):
                row["first_delta_db_p50_ms"] = first_delta_from_db(ids)
            if probe:
                probe.join(120)
                wait_done(probe.ids)
                row["first_delta_socket_p50_ms"] = pct(probe.samples, 50)
                row["first_delta_socket_max_ms"] = max(probe.samples)
            rows.append(row)
            print(
                f"  ours {workload['name']} n={n}: {wall:.2f} s, rss {rss:.0f} MB, "
                f"{connections} conns"
                + (
                    f", first delta on the socket p50 {row['first_delta_socket_p50_ms']:.0f} ms"
                    if probe
                    else ""
                ),
                flush=True,
            )
        sampler.stop()
    finally:
        procs.stop(proc)
    from django.conf import settings

    from agentruns.runtime.dispatch import claims

    pool = settings.DATABASES["default"]["OPTIONS"].get("pool") or {}
    config = {
        "q_workers": settings.Q_CLUSTER["workers"],
        "per_process": conf.RUNS_PER_PROCESS,
        "pool_max": pool.get("max_size", 0),
        # connections outside the pools (benchmarks/targets.py `connection_bound`)
        "claimer_listeners": int(claims.starts_by_notify()),
        "doorbell_listeners": 1,
    }
    return rows, config


def peer_latency_bound(
    peer: str, ns: tuple[int, ...], turn_ms: float, config: dict, tokens: int = 0
) -> list:
    concurrency = config["q_workers"] * config["per_process"]
    pool = config["q_workers"] * config["pool_max"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.peers_inflight",
            peer,
            dsn(),
            ",".join(map(str, ns)),
            str(turn_ms),
            str(concurrency),
            str(pool),
            str(tokens),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(rows) != len(ns):
        raise RuntimeError(f"{peer} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    for row in rows:
        print(f"  {peer} tokens={tokens} n={row['n']}: {row['wall_s']:.2f} s", flush=True)
    return rows


# ---------------------------------------------------------------------------- report
PEERS = (
    ("dbos", "DBOS Transact (queue)"),
    ("dbos-agent", "Pydantic AI agent + DBOSDurability (queue)"),
    ("langgraph", "LangGraph + PostgresSaver (thread pool)"),
)


def side_by_side(workload: dict, ns: tuple[int, ...], ours_only: tuple[int, ...] = ()) -> dict:
    ours, config = ours_latency_bound(ns + ours_only, workload)
    results = {"ours (real worker)": ours}
    for peer, name in PEERS:
        try:
            results[name] = peer_latency_bound(
                peer, ns, workload["turn_ms"], config, workload.get("tokens", 0)
            )
        except Exception as exc:  # a missing optional extra must not sink the rest
            print(f"  skipping {name}: {exc!r}", file=sys.stderr)
    return {"config": config, "results": results}


def streaming_workload(tmp: Path) -> dict:
    """The streaming side by side on PostgreSQL + Redis, with the web process for the probe."""
    from django.contrib.auth import get_user_model

    from agentruns.tokens import create_token
    from benchmarks.stream_latency import start_redis
    from benchmarks.workload import STREAM_TOKENS_PER_TURN
    from tests.procs import start_web

    try:
        redis_proc, redis_url = start_redis(tmp)
    except binaries.Missing as exc:  # the other workloads still run; the report says why
        print(f"  skipping the streaming workload: {exc}", file=sys.stderr, flush=True)
        return {}
    env = {"SCRIPTED_MODEL_LATENCY_MS": 0, "SCRIPTED_MODEL_DELAY_MS": TOKEN_MS}
    env["REDIS_URL"] = redis_url
    web, base_url = start_web(tmp, LOG_LEVEL="WARNING", **env)
    token = create_token(get_user_model().objects.get(username="lead"))
    workload = {
        "name": "streaming",
        "agent": "bench-stream",
        "env": env,
        "tokens": STREAM_TOKENS_PER_TURN,
        "turn_ms": STREAM_TOKENS_PER_TURN * TOKEN_MS,
        "token_ms": TOKEN_MS,
        "web": (base_url, token),
    }
    try:
        data = side_by_side(workload, STREAM_NS)
    finally:
        web.kill()
        redis_proc.kill()
    data.update({k: workload[k] for k in ("tokens", "turn_ms", "token_ms")})
    return data


def run_all(turn_ms: float = TURN_MS, ns: tuple[int, ...] = NS, only: str = "") -> dict:
    if only == "start":
        with tempfile.TemporaryDirectory(prefix="start-latency-") as tmp:
            return {"starts": start_latency(Path(tmp))}
    data: dict = {"turn_ms": turn_ms}
    if only in ("", "sleeping"):
        print("latency-bound, sleeping, side by side:", file=sys.stderr)
        sleeping = {
            "name": "sleeping",
            "agent": "bench-refund",
            "env": {"SCRIPTED_MODEL_LATENCY_MS": turn_ms, "SCRIPTED_MODEL_DELAY_MS": 0},
            "turn_ms": turn_ms,
        }
        data.update(side_by_side(sleeping, ns, () if QUICK else OURS_ONLY_NS))
    with tempfile.TemporaryDirectory(prefix="start-latency-") as tmp:
        if only in ("", "streaming"):
            print("latency-bound, streaming, side by side:", file=sys.stderr)
            data["streaming"] = streaming_workload(Path(tmp))
        if only == "":
            print("start latency:", file=sys.stderr)
            data["starts"] = start_latency(Path(tmp))
    return data


def markdown(data: dict) -> str:
    from benchmarks.inflight_report import section

    return section(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--ns", default=",".join(map(str, NS)))
    parser.add_argument(
        "--only", choices=["start", "sleeping", "streaming"], default="", help="one part only"
    )
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("run under scripts/with-postgres.sh (or set DATABASE_URL)")
    setup()
    data = run_all(ns=tuple(int(n) for n in args.ns.split(",")), only=args.only)
    if args.only == "start":
        print(json.dumps(data, indent=2))
        return
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "bench-inflight.json").write_text(json.dumps(data, indent=2, default=str))
    text = markdown(data)
    print(text)
    if args.write_docs:
        from benchmarks.inflight_report import write_docs

        write_docs(text)


if __name__ == "__main__":
    main()
