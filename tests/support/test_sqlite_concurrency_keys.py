"""Concurrency keys on the embedded default `make run` uses (SQLite, q2's ORM broker, one
writer at a time, no claimers: a doorbell per start and per admission). Real daphne and qcluster
on a fresh SQLite file: refund runs on two orders started over the API take turns per order
(sampled every 50 ms from a read-only connection), a run waiting in line says behind which run,
cancelling it moves the line on, and every other run finishes."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from tests.procs import Proc, free_port, sqlite_env, start_web, start_worker, wait_until
from tests.sqlite_templates import migrated_sqlite

ORDERS = ("ORD-1003", "ORD-1004")
PER_ORDER = 3


class Sampler(threading.Thread):
    """Most runs running at once on one order, read every 50 ms."""

    def __init__(self, db_path: Path) -> None:
        super().__init__(daemon=True)
        self.db_path, self.stopped, self.most, self.samples = db_path, threading.Event(), 0, 0

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=20) as db:
                    rows = db.execute(
                        "SELECT concurrency_key, COUNT(*) FROM agentruns_run "
                        "WHERE status = 'running' GROUP BY concurrency_key"
                    ).fetchall()
                self.most = max([self.most, *(n for key, n in rows if key is not None)])
                self.samples += 1
            except sqlite3.OperationalError:  # the writer's checkpoint: the next sample reads
                pass
            time.sleep(0.05)


def test_runs_on_one_order_take_turns_on_the_sqlite_default(tmp_path: Path, procs: list[Proc]):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    db_path = tmp_path / "db.sqlite3"
    overrides = sqlite_env(
        db_path,
        base_url,
        SCRIPTED_MODEL_LATENCY_MS=100,
        REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000,
    )
    token = migrated_sqlite(db_path, seeded=True)[-1].strip()
    web, _ = start_web(tmp_path, port=port, **overrides)
    procs.append(web)
    worker = start_worker(tmp_path, name="sqlite-keys", **overrides)
    procs.append(worker)
    sampler = Sampler(db_path)
    sampler.start()

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as http:
        started: dict[str, list[dict]] = {order: [] for order in ORDERS}
        for _ in range(PER_ORDER):
            for order in ORDERS:
                body = {"agent": "refund", "input": {"order_id": order, "message": "Broken."}}
                created = http.post("/api/runs", json=body, timeout=30)
                assert created.status_code == 201, created.text
                started[order].append(created.json())
        first, second, third = started[ORDERS[0]]
        assert second["waiting_behind"] == first["id"] and third["waiting_behind"] == second["id"]
        cancelled = http.post(f"/api/runs/{second['id']}/cancel", json={}, timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert http.get(f"/api/runs/{third['id']}").json()["waiting_behind"] in (
            first["id"],
            None,  # the first already ended and admitted it
        )

        def statuses() -> dict | None:
            found = {
                run["id"]: http.get(f"/api/runs/{run['id']}", timeout=30).json()
                for runs in started.values()
                for run in runs
            }
            ended = all(r["status"] in ("succeeded", "failed", "cancelled") for r in found.values())
            return found if ended else None

        try:
            runs = wait_until(statuses, timeout=150, interval=0.5, message="the runs to end")
        except TimeoutError:
            raise AssertionError(f"runs did not end\n{worker.log()}") from None
    sampler.stopped.set()
    sampler.join(timeout=5)
    assert {r["status"] for i, r in runs.items() if i != second["id"]} == {"succeeded"}
    assert sampler.samples >= 10 and sampler.most == 1, (sampler.samples, sampler.most)
    for runs_of_order in started.values():  # one after the other, in start order
        ordered = [runs[r["id"]] for r in runs_of_order if r["id"] != second["id"]]
        for before, after in zip(ordered, ordered[1:], strict=False):
            began, ended = (
                datetime.fromisoformat(after["started_at"]),
                datetime.fromisoformat(before["finished_at"]),
            )
            assert began >= ended, (before["id"], after["id"])
