"""Many runs in flight on the embedded default (`make run`): SQLite in WAL mode, q2's ORM
broker, no DATABASE_URL. SQLite takes one writer at a time, so its pools are small by default
(AGENTRUNS_RUNS_PER_PROCESS 16) and every write transaction queues for the lock (IMMEDIATE, a
busy timeout) instead of failing with "database is locked", while the web process writes too.

Real subprocesses on a fresh SQLite file (a copy of the seeded template, tests/sqlite_templates.py);
no pytest-django database is used.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.procs import Proc, free_port, sqlite_env, start_web, start_worker
from tests.sqlite_templates import migrated_sqlite

RUNS = 24


def statuses(db_path: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=20) as db:
        rows = db.execute("SELECT status, COUNT(*) FROM agentruns_run GROUP BY status").fetchall()
    return dict(rows)


def test_many_runs_in_flight_on_the_sqlite_default(tmp_path: Path):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    db_path = tmp_path / "db.sqlite3"
    overrides = sqlite_env(
        db_path,
        base_url,
        SCRIPTED_MODEL_LATENCY_MS=500,
        REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000,
    )
    token = migrated_sqlite(db_path, seeded=True)[-1].strip()
    procs: list[Proc] = []
    try:
        web, _ = start_web(tmp_path, port=port, **overrides)
        procs.append(web)
        procs.append(start_worker(tmp_path, name="sqlite-worker", **overrides))
        auth = {"Authorization": f"Bearer {token}"}

        def start(n: int) -> str:
            # started over the API from several clients at once: the web process writes while
            # the worker's threads do
            with httpx.Client(base_url=base_url, headers=auth, timeout=60) as http:
                order = f"ORD-{1001 + n}"
                body = {"agent": "refund", "input": {"order_id": order, "message": "Broken."}}
                created = http.post("/api/runs", json=body)
                assert created.status_code == 201, created.text
                return created.json()["id"]

        with ThreadPoolExecutor(4) as clients:
            run_ids = list(clients.map(start, range(RUNS)))
        peak = 0
        deadline = time.monotonic() + 180
        while True:
            counts = statuses(db_path)
            peak = max(peak, counts.get("running", 0))
            if counts.get("succeeded", 0) + counts.get("failed", 0) >= RUNS:
                break
            assert time.monotonic() < deadline, (counts, procs[1].log())
            time.sleep(0.05)
        # runs overlapped (2 worker processes x 16 slots), and none of them failed
        assert 1 < peak <= 32, peak
        assert counts == {"succeeded": RUNS}, (counts, procs[1].log())
        with httpx.Client(base_url=base_url, headers=auth, timeout=30) as http:
            for run_id in run_ids:
                run = http.get(f"/api/runs/{run_id}").json()
                refund = next(s for s in run["steps"] if s["tool"] == "issue_refund")
                ledger = http.get(
                    "/gateway/refunds", params={"order_id": run["input"]["order_id"]}
                ).json()["refunds"]
                assert [r["idempotency_key"] for r in ledger] == [refund["idempotency_key"]]
    finally:
        for proc in procs:
            proc.kill()
