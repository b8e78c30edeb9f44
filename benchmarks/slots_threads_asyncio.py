"""What a slot costs: N waiting runs as threads against N asyncio tasks (issue 22, item 3).

    .venv/bin/python -m benchmarks.slots_threads_asyncio [--ns 500,1000]

Each "run" does seven turns: a little CPU at some stack depth (like the engine's frames), then a
500 ms wait (a model turn). Threads are started up front and wait on an event, as the pool's do;
reported: RSS growth of the idle pool and while all runs wait, and the wall against the ideal
3.5 s. Each case runs in a fresh interpreter. No database: this isolates the carrier's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

TURNS, TURN_S = 7, 0.5


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def work() -> int:
    def deep(n: int) -> int:
        return deep(n - 1) if n else sum(range(2000))

    return deep(40)


def threads(n: int) -> dict:
    before = rss_mb()
    go = threading.Event()

    def run() -> None:
        go.wait()
        for _ in range(TURNS):
            work()
            time.sleep(TURN_S)

    pool = [threading.Thread(target=run) for _ in range(n)]
    for thread in pool:
        thread.start()
    idle = rss_mb() - before
    started = time.perf_counter()
    go.set()
    time.sleep(1)
    waiting = rss_mb() - before
    for thread in pool:
        thread.join()
    return {"idle_mb": idle, "waiting_mb": waiting, "wall_s": time.perf_counter() - started}


def tasks(n: int) -> dict:
    async def run() -> None:
        for _ in range(TURNS):
            work()
            await asyncio.sleep(TURN_S)

    async def main() -> dict:
        before = rss_mb()
        started = time.perf_counter()
        running = [asyncio.create_task(run()) for _ in range(n)]
        await asyncio.sleep(1)
        waiting = rss_mb() - before
        await asyncio.gather(*running)
        return {"idle_mb": 0.0, "waiting_mb": waiting, "wall_s": time.perf_counter() - started}

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="500,1000")
    parser.add_argument("--case", default="")
    args = parser.parse_args()
    if args.case:
        carrier, n = args.case.split(":")
        print(json.dumps((threads if carrier == "threads" else tasks)(int(n))))
        return
    print("| carrier | N | idle pool RSS (MB) | RSS while all wait (MB) | wall (s), ideal 3.5 |")
    print("|---|---:|---:|---:|---:|")
    for n in (int(x) for x in args.ns.split(",")):
        for carrier in ("threads", "asyncio"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.slots_threads_asyncio",
                    "--case",
                    f"{carrier}:{n}",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout)
            print(
                f"| {carrier} | {n} | {row['idle_mb']:.1f} | {row['waiting_mb']:.1f} | "
                f"{row['wall_s']:.2f} |"
            )


if __name__ == "__main__":
    main()
