"""The web process's CPU per POST /api/runs, two checkouts side by side.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.web_cpu \
        --a /tmp/webstart-base --b . [--posts 200] [--clients 8] [--rounds 3]

Per checkout and user: a fresh database migrated and seeded by that checkout's own code, its
daphne (`config.serve`, as the Procfile runs it; no worker, so the runs stay queued), a bearer
token, 20 warm-up POSTs, then `--posts` POST /api/runs from `--clients` threads. The figure is
daphne's CPU time (utime + stime from /proc) over the burst divided by the POSTs, and the
database statements per POST (pg_stat_statements is not needed: pg_stat_database's
xact_commit counts the commits; the statements are counted once with the ORM's own log in
tests/api/test_access_cache.py). Users: `lead` (a superuser in no group, as the other benches
start their runs) and `trainee` (a group with a tool policy, the path a support team takes).
Rounds alternate A and B so both see the same machine load; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import uuid
from pathlib import Path

from benchmarks.idle_sockets import ROOT, admin, cpu_seconds, database_url, manage
from benchmarks.procs import QUOTAS_OFF_THE_WAY, start_web, stop_web


def _post_burst(url: str, token: str, posts: int, clients: int) -> None:
    import httpx

    def client(count: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for i in range(count):
                body = {"agent": "refund", "input": {"order_id": f"ORD-{1001 + i % 50}"}}
                answer = http.post(
                    "/api/runs", json=body, headers={"Authorization": f"Bearer {token}"}
                )
                if answer.status_code != 201:
                    raise RuntimeError(
                        f"POST /api/runs answered {answer.status_code}: {answer.text}"
                    )

    threads = [
        threading.Thread(target=client, args=(posts // clients + (i < posts % clients),))
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def case(checkout: Path, users: list[str], posts: int, clients: int) -> dict[str, float]:
    """daphne's CPU ms per POST for each user, on a fresh database of `checkout`."""

    name = f"webcpu_{uuid.uuid4().hex[:8]}"
    admin(f"CREATE DATABASE {name}")
    env = {
        **{k: v for k, v in __import__("os").environ.items() if k != "AGENTRUNS_AGENT_MODULES"},
        "DATABASE_URL": database_url(name),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_LEVEL": "WARNING",
        **QUOTAS_OFF_THE_WAY,
    }
    manage(checkout, env, "migrate", "--noinput", "-v0")
    manage(checkout, env, "seed_demo")
    tokens = {
        u: manage(checkout, env, "create_api_token", u).strip().splitlines()[-1].strip()
        for u in users
    }
    web, url = start_web(checkout, env)
    out: dict[str, float] = {}
    try:
        for user in users:
            _post_burst(url, tokens[user], 20, 2)  # warm-up: imports, connections, caches
            before = cpu_seconds(web.pid)
            _post_burst(url, tokens[user], posts, clients)
            out[user] = (cpu_seconds(web.pid) - before) * 1000 / posts
    finally:
        stop_web(web)
        admin(f"DROP DATABASE {name} WITH (FORCE)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--b", type=Path, default=ROOT)
    parser.add_argument("--posts", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--users", default="lead,trainee")
    args = parser.parse_args()
    users = args.users.split(",")
    samples: dict[str, dict[str, list[float]]] = {
        "a": {u: [] for u in users},
        "b": {u: [] for u in users},
    }
    for round_ in range(args.rounds):
        for side in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
            got = case(getattr(args, side).resolve(), users, args.posts, args.clients)
            for user, ms in got.items():
                samples[side][user].append(ms)
            print(
                f"round {round_ + 1} {side}: "
                + ", ".join(f"{u} {ms:.2f} ms" for u, ms in got.items()),
                flush=True,
            )
    result = {}
    for user in users:
        a, b = statistics.median(samples["a"][user]), statistics.median(samples["b"][user])
        result[user] = {
            "a_ms_per_post": round(a, 2),
            "b_ms_per_post": round(b, 2),
            "b_over_a": round(b / a, 3),
        }
        print(f"{user}: web CPU per POST /api/runs A {a:.2f} ms, B {b:.2f} ms (B/A {b / a:.2f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
