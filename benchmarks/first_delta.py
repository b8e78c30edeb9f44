"""Start to first streamed delta, as a client sees it: POST /api/runs, then the run's first
`model.delta` frame on its WebSocket (a real `websockets` client with a bearer token), one run
at a time (`start_latency`) or while a batch runs (`SocketProbe`); and as the database saw it
(`first_delta_from_db`: run created -> its first `model.delta` event). Part of
`benchmarks/inflight.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmarks.sampling import pct
from tests import binaries

START_SAMPLES = 20 if os.environ.get("BENCH_QUICK") else 40
PROBES = 8  # runs started through the web during a streaming batch, a socket each
PROBE_SPACING_S = 0.25


def first_delta_from_db(ids: list) -> float:
    """p50 over `ids` of run created -> its first `model.delta` event committed (ms)."""
    from django.db.models import Min

    from agentruns.models import Run, RunEvent

    created = dict(Run.objects.filter(id__in=ids).values_list("id", "created_at"))
    first = (
        RunEvent.objects.filter(run_id__in=ids, type="model.delta")
        .values("run_id")
        .annotate(at=Min("created_at"))
    )
    gaps = [(row["at"] - created[row["run_id"]]).total_seconds() * 1000 for row in first]
    return pct(gaps, 50) if gaps else float("nan")


class SocketProbe(threading.Thread):
    """While a batch runs: PROBES runs started through the web (POST /api/runs), the time from
    the POST to each run's first `model.delta` frame on its WebSocket."""

    def __init__(self, base_url: str, token: str, agent: str) -> None:
        super().__init__(name="bench-probe", daemon=True)
        self.base_url, self.token, self.agent = base_url, token, agent
        self.samples: list[float] = []
        self.ids: list[str] = []

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base_url, timeout=60) as http:
            for i in range(PROBES):
                time.sleep(PROBE_SPACING_S)
                body = {"agent": self.agent, "input": {"order_id": f"ORD-{1100 + i}"}}
                sent = time.monotonic()
                created = http.post(
                    "/api/runs", json=body, headers={"Authorization": f"Bearer {self.token}"}
                )
                created.raise_for_status()
                self.ids.append(created.json()["id"])
                got = asyncio.run(first_delta(self.base_url, self.token, self.ids[-1]))
                self.samples.append((got - sent) * 1000)


async def first_delta(
    base_url: str, token: str, run_id: str, opened: list[float] | None = None
) -> float:
    """When (monotonic) the run's first `model.delta` frame arrived; `opened` gets the wall
    time the socket was open."""
    from websockets.asyncio.client import connect

    url = base_url.replace("http://", "ws://") + f"/ws/runs/{run_id}/?after=0"
    async with connect(
        url, origin=base_url, additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        if opened is not None:
            opened.append(time.time())
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "model.delta":
                return time.monotonic()


SEGMENTS = (  # start -> first delta, in order; each from one clock (all processes on this host)
    ("post", "POST /api/runs handled (client: sent -> answer)"),
    ("queued", "run created -> claimed (NOTIFY -> the claimer's wake -> claim)"),
    ("first_delta", "claimed -> first delta committed (run set-up, model call, first token)"),
    ("to_socket", "first delta committed -> its frame on the socket (nudge or replay)"),
    ("socket_open", "(beside: POST answered -> WebSocket open)"),
)


def _segments(run_id: str, sent: float, answered: float, opened: float, got: float) -> dict:
    """One start's segments (ms) from the client's clock and the rows' timestamps."""
    from agentruns.models import Run, RunEvent

    run = Run.objects.get(id=run_id)
    delta = RunEvent.objects.filter(run_id=run_id, type="model.delta").order_by("seq").first()
    created, claimed = run.created_at.timestamp(), run.started_at.timestamp()
    committed = delta.created_at.timestamp()
    return {
        "post": (answered - sent) * 1000,
        "queued": (claimed - created) * 1000,
        "first_delta": (committed - claimed) * 1000,
        "to_socket": (got - max(committed, opened)) * 1000,
        "socket_open": (opened - answered) * 1000,
    }


def start_latency_case(
    tmp: Path, label: str, env: dict[str, object], token: str, segments: bool = True
) -> dict:
    """`segments`: read the rows' timestamps too (the case's database is this process's)."""
    import httpx

    from tests.procs import start_web, start_worker

    web, base_url = start_web(tmp, **env)
    worker = start_worker(tmp, name=f"start-{label}", **env)
    samples, parts = [], []
    try:
        time.sleep(4)
        with httpx.Client(base_url=base_url, timeout=30) as http:
            auth = {"Authorization": f"Bearer {token}"}
            for i in range(START_SAMPLES + 3):
                body = {"agent": "refund", "input": {"order_id": f"ORD-{1001 + i % 50}"}}
                sent, sent_at = time.monotonic(), time.time()
                created = http.post("/api/runs", json=body, headers=auth)
                created.raise_for_status()
                answered = time.time()
                opened: list[float] = []
                got = asyncio.run(first_delta(base_url, token, created.json()["id"], opened))
                if i >= 3:  # the first ones warm the processes up
                    samples.append((got - sent) * 1000)
                    got_at = sent_at + (got - sent)
                    if segments:
                        run_id = created.json()["id"]
                        parts.append(_segments(run_id, sent_at, answered, opened[0], got_at))
                time.sleep(0.3)
    finally:
        worker.kill()
        web.kill()
    row = {"case": label, "p50_ms": pct(samples, 50), "p99_ms": pct(samples, 99)}
    row["mean_ms"] = statistics.fmean(samples)
    print(f"  start latency {label}: p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms")
    if parts:
        row["segments_p50_ms"] = {n: pct([p[n] for p in parts], 50) for n, _ in SEGMENTS}
        for name, what in SEGMENTS:
            print(f"    {row['segments_p50_ms'][name]:6.1f} ms p50  {what}")
    return row


def start_latency(tmp: Path) -> list[dict]:
    from django.contrib.auth import get_user_model

    from agentruns.tokens import create_token
    from benchmarks.stream_latency import start_redis
    from tests.procs import base_env, manage

    common = {"SCRIPTED_MODEL_DELAY_MS": 15, "LOG_LEVEL": "WARNING"}  # the scripted default
    token = create_token(get_user_model().objects.get(username="lead"))
    rows = []
    try:
        redis_proc, redis_url = start_redis(tmp)
    except binaries.Missing as exc:
        print(f"  skipping the PostgreSQL + Redis case: {exc}", file=sys.stderr, flush=True)
    else:
        try:
            rows.append(
                start_latency_case(
                    tmp, "PostgreSQL + Redis", {**common, "REDIS_URL": redis_url}, token
                )
            )
        finally:
            redis_proc.kill()
    sqlite = {**common, "DATABASE_URL": "", "SQLITE_PATH": tmp / "start.sqlite3"}
    env = base_env(**sqlite)
    manage(env, "migrate", "--noinput")
    manage(env, "seed_demo")
    sqlite_token = manage(env, "create_api_token", "lead").strip().splitlines()[-1].strip()
    sqlite_case = start_latency_case(
        tmp, "SQLite default (DB poll)", sqlite, sqlite_token, segments=False
    )
    rows.append(sqlite_case)
    return rows
