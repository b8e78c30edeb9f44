"""What idle sockets cost: one viewer token holding N idle `ws/runs/<id>/` sockets.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.idle_sockets \
        [--checkout DIR] [--sockets 400] [--runs 1] [--seconds 20] [--env NAME=VALUE ...]

Against a real daphne on PostgreSQL: a fresh database per case (migrated and seeded by the
checkout's own code, so `--checkout` can measure an older commit from a `git worktree`),
`--runs` runs that never move (the sockets are spread over them round-robin: each run watched
in a process has its own feed and poll), a viewer's bearer token, then N sockets opened with it by the real
`websockets` client, which never reconnects (a close is counted, not retried). After they
settle, over `--seconds`: daphne's CPU (utime + stime from /proc, % of one core), PostgreSQL's
transactions per second in that database (pg_stat_database.xact_commit delta), and the
sockets still open at the end. The same window with no socket is the idle floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from benchmarks.procs import python_for, start_web, stop_web

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def database_url(name: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + name))


def admin(sql: str) -> None:
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def commits(name: str) -> int:
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def seeded_database(
    checkout: Path, prefix: str, extra: dict[str, str], seed: tuple[str, ...] = ()
) -> dict[str, str]:
    """A fresh database of the server, migrated and seeded by `checkout` (`seed`: arguments of
    its `seed_demo`): the environment of that checkout's processes on it (`extra` on top)."""
    name = f"{prefix.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    admin(f"CREATE DATABASE {name}")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(name),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    env.pop("AGENTRUNS_AGENT_MODULES", None)
    manage(checkout, env, "migrate", "--noinput", "-v0")
    manage(checkout, env, "seed_demo", *seed)
    return env


def manage(checkout: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [python_for(checkout), "manage.py", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


async def hold(url: str, run_ids: list[str], token: str, n: int, seconds: float, measure) -> dict:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {token}"}
    sockets = []

    async def one(i: int):
        ws_url = url.replace("http", "ws") + f"/ws/runs/{run_ids[i % len(run_ids)]}/?after=0"
        try:
            return await connect(ws_url, origin=url, additional_headers=headers, open_timeout=60)
        except Exception as exc:  # refused at the handshake, or timed out
            print("  connect failed:", type(exc).__name__)
            return None

    for start in range(0, n, 50):  # 50 handshakes at a time
        opened = await asyncio.gather(*(one(i) for i in range(start, min(n, start + 50))))
        sockets.extend(s for s in opened if s is not None)
    await asyncio.sleep(5)  # settle: the first frames, the first rechecks
    result = await asyncio.to_thread(measure, seconds)
    open_sockets = 0
    for socket in sockets:
        try:
            await asyncio.wait_for(socket.ping(), timeout=5)
            open_sockets += 1
        except Exception:
            pass
    codes: dict[str, int] = {}
    for socket in sockets:
        code = socket.close_code
        if code is not None:
            codes[str(code)] = codes.get(str(code), 0) + 1
        await socket.close()
    return {**result, "sockets_opened": len(sockets), "sockets_held": open_sockets, "closed": codes}


def case(
    checkout: Path, label: str, sockets: int, runs: int, seconds: float, extra: dict[str, str]
) -> dict:
    env = seeded_database(checkout, f"idle_{label}", extra)
    name = env["DATABASE_URL"].rsplit("/", 1)[-1]
    token = manage(checkout, env, "create_api_token", "viewer").strip().splitlines()[-1].strip()
    run_ids = manage(
        checkout,
        env,
        "shell",
        "-c",
        "from agentruns.models import Run; "
        f"[print(Run.objects.create(agent='refund', input={{}}, status='running').id) "
        f"for _ in range({runs})]",
    ).split()[-runs:]
    web, url = start_web(checkout, env)
    try:

        def measure(window: float) -> dict:
            cpu0, tx0, t0 = cpu_seconds(web.pid), commits(name), time.monotonic()
            time.sleep(window)
            cpu1, tx1, t1 = cpu_seconds(web.pid), commits(name), time.monotonic()
            # the two reads of pg_stat_database are transactions of another database: not counted
            return {
                "daphne_cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
                "pg_xact_per_s": round((tx1 - tx0) / (t1 - t0), 1),
            }

        time.sleep(3)
        idle = measure(seconds)
        held = asyncio.run(hold(url, run_ids, token, sockets, seconds, measure))
    finally:
        stop_web(web)
        admin(f"DROP DATABASE {name} WITH (FORCE)")
    row = {"case": label, "runs": runs, "env": extra, "idle": idle, **held}
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--label", default="after")
    parser.add_argument("--sockets", type=int, default=400)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for daphne")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    case(args.checkout.resolve(), args.label, args.sockets, args.runs, args.seconds, extra)


if __name__ == "__main__":
    main()
