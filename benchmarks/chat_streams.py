"""What one user's concurrent chat streams cost a web process: threads and memory.

    PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.chat_streams \
        [--checkout DIR] [--label after] [--streams 300] [--env NAME=VALUE ...]

Against a real daphne on PostgreSQL (a fresh database per case, migrated and seeded by the
checkout's own code, so `--checkout` can measure an older commit unpacked with `git archive`),
with no worker: every chat's run stays queued, so every accepted stream stays open and waits.
One user's bearer token sends `--streams` chat requests at once (`POST /api/chat/refund`, each
its own chat id; the start quotas are out of the way, so only the stream caps can refuse). Once
they settle: the statuses, daphne's OS threads and RSS (`/proc/<pid>/status`), and the same
after every stream is closed. The idle floor is read before the first request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx

from benchmarks.idle_sockets import admin, manage, seeded_database
from benchmarks.procs import QUOTAS_OFF_THE_WAY, start_web, stop_web

ROOT = Path(__file__).resolve().parent.parent


def process_status(pid: int) -> dict:
    """daphne's OS threads and resident memory (MB), from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "threads": int(fields["Threads"]),
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
    }


async def hold_streams(url: str, token: str, n: int, pid: int) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    statuses: dict[str, int] = {}
    retry_after: set[str] = set()
    release = asyncio.Event()
    opened = asyncio.Semaphore(0)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "refund"}]}
        body = {"id": f"bench-{i}", "messages": [message], "input": {"order_id": "ORD-1001"}}
        try:
            async with client.stream(
                "POST", f"{url}/api/chat/refund", json=body, headers=headers
            ) as answer:
                key = str(answer.status_code)
                statuses[key] = statuses.get(key, 0) + 1
                if answer.status_code == 429:
                    retry_after.add(answer.headers.get("Retry-After", "missing"))
                if answer.status_code == 200:
                    lines = answer.aiter_lines()
                    while not (await anext(lines)).startswith("data:"):
                        pass
                opened.release()
                if answer.status_code == 200:
                    await release.wait()
        except Exception as exc:  # counted, not retried
            cause = exc.__cause__ or exc.__context__
            key = f"{type(exc).__name__} {exc} {cause!r}"[:100]
            statuses[key] = statuses.get(key, 0) + 1
            opened.release()

    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        started = time.monotonic()
        tasks = [asyncio.create_task(one(client, i)) for i in range(n)]
        for _ in range(n):
            await opened.acquire()
        answered = round(time.monotonic() - started, 2)
        await asyncio.sleep(3)  # settle: the first rechecks, the feeds' polls
        held = process_status(pid)
        release.set()
        await asyncio.gather(*tasks)
    await asyncio.sleep(3)
    return {
        "statuses": statuses,
        "retry_after": sorted(retry_after),
        "all_answered_s": answered,
        "held": held,
        "after_close": process_status(pid),
    }


def case(checkout: Path, label: str, streams: int, extra: dict[str, str]) -> dict:
    env = seeded_database(checkout, f"chat_{label}", {**QUOTAS_OFF_THE_WAY, **extra})
    name = env["DATABASE_URL"].rsplit("/", 1)[-1]
    token = manage(checkout, env, "create_api_token", "approver").strip().splitlines()[-1]
    web, url = start_web(checkout, env)
    try:
        time.sleep(2)
        idle = process_status(web.pid)
        held = asyncio.run(hold_streams(url, token.strip(), streams, web.pid))
    finally:
        stop_web(web)
        admin(f"DROP DATABASE {name} WITH (FORCE)")
    row = {"case": label, "streams": streams, "env": extra, "idle": idle, **held}
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--label", default="after")
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for daphne")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    case(args.checkout.resolve(), args.label, args.streams, extra)


if __name__ == "__main__":
    main()
