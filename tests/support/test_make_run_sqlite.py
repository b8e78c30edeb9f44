"""The embedded default `make run` uses: SQLite (WAL) + q2's ORM broker, no DATABASE_URL.

Real subprocesses all the way: `manage.py migrate`, `seed_demo` and `create_api_token` on a fresh
SQLite file, then daphne + qcluster on it, a refund run started over the JSON API and followed to
the end, and the gateway's own ledger checked over HTTP. No pytest-django database is used.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from support.management.commands.seed_demo import amount_for
from tests.procs import (
    Proc,
    base_env,
    free_port,
    gateway_refunds,
    manage,
    sqlite_env,
    start_web,
    start_worker,
    wait_until,
)

ORDER_ID = "ORD-1007"


def test_refund_run_completes_on_the_sqlite_default(tmp_path: Path, procs: list[Proc]):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    db_path = tmp_path / "db.sqlite3"
    # the refund must not park
    overrides = sqlite_env(db_path, base_url, REFUND_APPROVAL_THRESHOLD_CENTS=1_000_000_000)
    env = base_env(**overrides)
    assert env["DATABASE_URL"] == ""

    manage(env, "migrate", "--noinput")
    manage(env, "seed_demo")
    token = manage(env, "create_api_token", "lead").strip().splitlines()[-1].strip()
    assert token and " " not in token
    assert db_path.exists()

    web, url = start_web(tmp_path, port=port, **overrides)
    procs.append(web)
    worker = start_worker(tmp_path, name="sqlite-worker", **overrides)
    procs.append(worker)
    assert url == base_url

    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=30) as http:

        def start_refund() -> httpx.Response:
            return http.post(
                "/api/runs",
                json={
                    "agent": "refund",
                    "input": {"order_id": ORDER_ID, "message": "It arrived broken."},
                },
                headers={"Idempotency-Key": "sqlite-smoke-1"},
            )

        created = start_refund()
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        def finished() -> dict | None:
            body = http.get(f"/api/runs/{run_id}").json()
            return (
                body if body["status"] in {"succeeded", "failed", "cancelled", "waiting"} else None
            )

        try:
            run = wait_until(finished, timeout=120, interval=0.25, message="the run to finish")
        except TimeoutError:
            raise AssertionError(f"run did not finish\n{worker.log()}\n{web.log()}") from None
        assert run["status"] == "succeeded", (run, worker.log())
        assert run["output"].startswith("Done: refunded")
        tools = [s["tool"] for s in run["steps"] if s["kind"] == "tool"]
        assert tools == ["lookup_order", "issue_refund", "add_ticket_note", "send_customer_reply"]
        assert all(s["status"] == "succeeded" and s["attempts"] == 1 for s in run["steps"])
        refund_step = next(s for s in run["steps"] if s["tool"] == "issue_refund")

        events = http.get(f"/api/runs/{run_id}/events", params={"after": 0}).json()["events"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

        # a repeated Idempotency-Key returns the same run, not a second refund
        again = start_refund()
        assert again.status_code == 200 and again.json()["id"] == run_id

    ledger = gateway_refunds(base_url, ORDER_ID)
    assert len(ledger) == 1
    refund = ledger[0]
    assert refund["idempotency_key"] == refund_step["idempotency_key"]
    # nothing in the message names a smaller amount: the whole order is refunded
    assert refund["amount_cents"] == refund_step["result"]["amount_cents"] == amount_for(1007)
    assert gateway_refunds(base_url) == [refund]
