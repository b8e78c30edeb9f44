"""The model provider's rate limit kept in advance (issue 30, item 5; part of `make bench`).

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.model_rate_limit \
        [--runs 500] [--rpm 60] [--mode echo|refund] [--jitter 0.25] [--off-runs 50] [--write-docs]

`--runs` runs of the demo's `refund` agent (each on an order of its own) started at once against
the fake OpenAI-compatible server, a process of its own (scripts/fake_openai_server.py) limited
to `--rpm` requests a minute and ceil(rpm / 60) in any second, answering 429 beyond either. Its
`--mode`: `echo` answers the first request with text (one model request a run: the issue's
"500 runs at once against 60 a minute" in about ten minutes), `refund` plays the refund flow
(four requests a run, the refund through the gateway). Through a real worker (`qcluster` with
its defaults, 2 worker processes) with AGENTRUNS_MODEL_LIMITS = {model: {"rpm": rpm}} and
AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS = `--jitter`, and the refund gateway in a real web process.
Counted at the fake server: requests admitted and refused (429), and the most it admitted in any
second and any minute. Sampled every second: runs running (a lease, a pool slot) and runs queued
waiting on the limit, the worker's threads. Side by side, `--off-runs` without
AGENTRUNS_MODEL_LIMITS: what the provider's limit does to a burst when only the after-the-fact
backoff (429 -> a model outage) handles it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

MODEL = "openai/fake-model"
QUICK = bool(os.environ.get("BENCH_QUICK"))
SECTION = "model-rate-limit"


def request_interval(rpm: int, jitter: float | None) -> float:
    from agentruns.runtime.access.model_limits import request_interval as interval

    return interval(rpm, 0.25 if jitter is None else jitter)


def setup(orders: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", orders=orders, stdout=devnull)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REQUESTS_PER_RUN = {"echo": 1, "refund": 4}


def start_provider(rpm: int, mode: str) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "scripts/fake_openai_server.py", f"--port={port}", f"--mode={mode}"]
        + ["--delay-ms=5", f"--rpm={rpm}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/models", timeout=2)
            return proc, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def threads_of(group: int) -> int:
    """Threads of every process in the process group `group` (the worker cluster)."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if os.getpgid(int(status.parent.name)) != group:
                continue
            for line in status.read_text().splitlines():
                if line.startswith("Threads:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def ready(group: int) -> int:
    """Wait until the worker cluster's thread count settles (its pools started their threads);
    returns it."""
    seen, steady = -1, 0
    deadline = time.monotonic() + 120
    while steady < 3 and time.monotonic() < deadline:
        time.sleep(1)
        count = threads_of(group)
        steady = steady + 1 if count == seen and count > 100 else 0
        seen = count
    return seen


def most_in_window(history: list[tuple[float, bool]], window: float) -> int:
    admitted = sorted(t for t, ok in history if ok)
    most, start = 0, 0
    for end, moment in enumerate(admitted):
        while moment - admitted[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


def batch(runs: int, offset: int, jitter: float | None, rpm: int, mode: str) -> dict:
    """`runs` refund runs through a fresh provider, web process and worker, with the limit and
    this jitter allowance (None: no limit set); what it measured."""
    import httpx
    from django.db import connection
    from django.db.models import Max, Min

    from agentruns.models import Run, RunEvent, RunStatus
    from agentruns.runtime.access.model_limits import WAITING
    from agentruns.runtime.events import EventType
    from agentruns.services import start_run
    from benchmarks.procs import QUOTAS_OFF_THE_WAY, start_qcluster, start_web, stop, stop_web

    provider, provider_url = start_provider(rpm, mode)
    env = {
        **os.environ,
        **QUOTAS_OFF_THE_WAY,
        "AGENTRUNS_MODEL": MODEL,
        "OPENAI_BASE_URL": provider_url,
        "OPENAI_API_KEY": "sk-bench",
        "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",  # no approvals: straight through
    }
    if jitter is not None:
        env["AGENTRUNS_MODEL_LIMITS"] = json.dumps({MODEL: {"rpm": rpm}})
        env["AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS"] = str(jitter)
    web, url = start_web(ROOT, env)
    worker_env = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    worker = start_qcluster(
        os.environ["DATABASE_URL"], **worker_env, REFUND_GATEWAY_URL=url + "/gateway"
    )
    samples: list[tuple[int, int, int]] = []
    try:
        baseline_threads = ready(worker.pid)
        ids = [
            start_run(
                "refund",
                {"order_id": f"ORD-{1001 + offset + i}", "message": "It arrived broken, refund it"},
                model=MODEL,
            ).run.id
            for i in range(runs)
        ]
        requests = runs * REQUESTS_PER_RUN[mode]
        deadline = time.monotonic() + max(600, 3 * requests * request_interval(rpm, jitter))
        while True:
            rows = list(Run.objects.filter(id__in=ids).values_list("status", "error"))
            running = sum(1 for status, _ in rows if status == RunStatus.RUNNING)
            waiting = sum(1 for status, e in rows if status == RunStatus.QUEUED and WAITING in e)
            samples.append((running, waiting, threads_of(worker.pid)))
            if all(status in ("succeeded", "failed", "cancelled") for status, _ in rows):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{runs} runs did not finish")
            time.sleep(1)
        counted = httpx.get(provider_url + "/_fake/limit", timeout=30).json()
        span = Run.objects.filter(id__in=ids).aggregate(
            first=Min("created_at"), last=Max("finished_at")
        )
        statuses = list(Run.objects.filter(id__in=ids).values_list("status", flat=True))
        backoffs = RunEvent.objects.filter(
            run_id__in=ids, type=EventType.RUN_STATUS, data__status=RunStatus.QUEUED
        ).values_list("data", flat=True)
        # requests not sent, found too late after their slot at the wire (openai_compatible.py)
        missed = sum(1 for data in backoffs if "after its rate-limit slot" in json.dumps(data))
    finally:
        stop(worker)
        stop_web(web)
        provider.kill()
        provider.wait(10)
        connection.close()
    history = counted["history"]
    return {
        "runs": runs,
        "rpm": rpm,
        "mode": mode,
        "jitter": jitter,
        "succeeded": statuses.count("succeeded"),
        "wall_s": (span["last"] - span["first"]).total_seconds(),
        "admitted": counted["admitted"],
        "refused_429": counted["refused"],
        "not_sent_late": missed,
        "most_in_a_second": most_in_window(history, 1.0),
        "most_in_a_minute": most_in_window(history, 60.0),
        "provider_per_second": counted["per_second"],
        "most_running": max(r for r, _, _ in samples),
        "most_waiting": max(w for _, w, _ in samples),
        "worker_threads": [baseline_threads, max(t for _, _, t in samples)],
        # seconds from the first request to each one refused
        "refused_at": [round(t - history[0][0], 1) for t, ok in history if not ok],
    }


def report(rows: list[dict], load: float) -> str:
    rpm, mode = rows[0]["rpm"], rows[0]["mode"]
    per_second = math.ceil(rpm / 60)
    jitters = sorted({row["jitter"] for row in rows if row["jitter"] is not None})
    slots = "; ".join(
        f"{j:g} s: a slot every {request_interval(rpm, j):.3g} s, "
        f"{60 / request_interval(rpm, j):.0f} a minute"
        for j in jitters
    )
    asks = (
        "one model request a run (the fake answers with text)"
        if mode == "echo"
        else ("four model requests a run (the refund flow, the refund through the gateway)")
    )
    lines = [
        "## The model's rate limit kept in advance (issue 30, item 5)",
        "",
        "Written by `benchmarks/model_rate_limit.py` in `make bench`: runs of the demo's refund "
        "agent started at once against the fake OpenAI-compatible server (its own process) "
        f"limited to {rpm} requests a minute and {per_second} in any second (429 beyond either, "
        f"counted there), {asks}, through a real `qcluster` (2 worker processes) and the "
        "gateway in a real web process. With the limit: `AGENTRUNS_MODEL_LIMITS` for the model "
        f"and the jitter allowance shown (`AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS`, {slots}). "
        "Without: only the after-the-fact backoff (a 429 is an outage the run backs off from). "
        f"1-minute load average at the end: {load:.1f} (2 cores shared with other work).",
        "",
        "| limit, jitter allowance | runs | succeeded | wall | requests admitted | answered 429 "
        "(in the first minute) "
        "| most in any second / minute at the provider | runs running at most | runs waiting "
        "queued at most | requests not sent (too late after their slot) "
        "| worker threads before / at most |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        limit = "unset" if row["jitter"] is None else f"set, {row['jitter']:g} s"
        lines.append(
            f"| {limit} | "
            f"{row['runs']} | {row['succeeded']} | "
            f"{row['wall_s']:.0f} s | {row['admitted']} | **{row['refused_429']}** "
            f"({sum(1 for t in row['refused_at'] if t < 60)}) | "
            f"{row['most_in_a_second']} / {row['most_in_a_minute']} | {row['most_running']} | "
            f"{row['most_waiting']} | {row['not_sent_late']} | "
            f"{row['worker_threads'][0]} / {row['worker_threads'][1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=60 if QUICK else 500)
    parser.add_argument("--rpm", type=int, default=60)
    parser.add_argument("--mode", choices=sorted(REQUESTS_PER_RUN), default="echo")
    parser.add_argument("--jitter", type=float, default=0.25)  # the setting's default
    parser.add_argument("--off-runs", type=int, default=20 if QUICK else 50)
    parser.add_argument("--json", type=Path, default=ROOT / "var" / "bench-model-rate-limit.json")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    setup(orders=args.runs + args.off_runs)
    rows = [batch(args.runs, 0, args.jitter, args.rpm, args.mode)]
    if args.off_runs:
        rows.append(batch(args.off_runs, args.runs, None, args.rpm, args.mode))
    for row in rows:
        print(json.dumps(row))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))
    text = report(rows, os.getloadavg()[0])
    print(text)
    if args.write_docs:
        from benchmarks.docs import write_marked_section

        write_marked_section(SECTION, text)


if __name__ == "__main__":
    main()
