"""The docs/BENCHMARKS.md section of `benchmarks/inflight.py`: tables and the targets of issue 12."""

from __future__ import annotations

import os
import platform

from benchmarks.docs import write_marked_section

AUX_PROCESSES = 4  # qcluster's main process, q2's sentinel, pusher and monitor
AUX_CONNECTIONS = 2  # each: its pool's one connection; the pusher's LISTEN, the sweeper's


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def section(data: dict) -> str:
    cfg, results, turn = data["config"], data["results"], data["turn_ms"]
    lines = [
        "## Many runs in flight: latency-bound, side by side",
        "",
        'Command: `PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.inflight '
        "--write-docs` (also the last part of `make bench`). Method in `benchmarks/inflight.py`.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
        f"{platform.python_version()}, PostgreSQL (fsync on). Workload: the seven-step refund flow, "
        f"every model turn waits {turn:.0f} ms; N runs started together by 8 clients. Ours: one "
        f"`qcluster` with its defaults, {cfg['q_workers']} worker processes x "
        f"{cfg['per_process']} runs in flight (AGENTRUNS_RUNS_PER_PROCESS), a psycopg pool of at "
        f"most {cfg['pool_max']} connections per process. Peers: the same concurrency "
        f"({cfg['q_workers'] * cfg['per_process']}) and {cfg['q_workers'] * cfg['pool_max']} "
        "pooled connections.",
        "",
        "| system | N | wall (s) | runs/s | x one run | peak RSS (MB) | RSS growth (MB) | peak PG connections |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.items():
        one = rows[0]["wall_s"]
        for r in rows:
            lines.append(
                f"| {name} | {r['n']} | {r['wall_s']:.2f} | {r['n'] / r['wall_s']:.1f} | "
                f"{r['wall_s'] / one:.2f} | {r['rss_mb']:.0f} | {r['rss_growth_mb']:.0f} | "
                f"{r['pg_connections']} |"
            )
    ours = results["ours (real worker)"]
    top = ours[-1]
    ratio = top["wall_s"] / ours[0]["wall_s"]
    bound = cfg["q_workers"] * cfg["pool_max"] + AUX_PROCESSES * AUX_CONNECTIONS
    peers = {
        n: rows[-1]["n"] / rows[-1]["wall_s"]
        for n, rows in results.items()
        if n != "ours (real worker)"
    }
    fastest = max(peers.items(), key=lambda kv: kv[1]) if peers else None
    ours_rate = top["n"] / top["wall_s"]
    lines += [
        "",
        "| target (issue 12) | result |",
        "|---|---|",
        f"| {top['n']} runs together within 1.5x one run's time | {_met(ratio <= 1.5)}: {ratio:.2f}x "
        f"({top['wall_s']:.2f} s against {ours[0]['wall_s']:.2f} s) |",
        f"| worker RSS grows at most 150 MB at {top['n']} in flight | "
        f"{_met(top['rss_growth_mb'] <= 150)}: +{top['rss_growth_mb']:.0f} MB (largest worker process) |",
        f"| PostgreSQL connections within the pool size | {_met(top['pg_connections'] <= bound)}: "
        f"peak {top['pg_connections']} for {top['n']} runs in flight; bound {cfg['q_workers']} "
        f"worker pools x {cfg['pool_max']} + {AUX_PROCESSES} other q2 processes x "
        f"{AUX_CONNECTIONS} = {bound} |",
    ]
    if fastest:
        lines.append(
            f"| throughput at {top['n']} at least the faster peer's | {_met(ours_rate >= fastest[1])}: "
            f"{ours_rate:.1f} runs/s against {fastest[1]:.1f} ({fastest[0]}) |"
        )
    if data.get("starts"):
        lines += [
            "",
            "### Start latency: POST /api/runs to the first model delta on the socket",
            "",
            "| deployment | p50 (ms) | p99 (ms) | mean (ms) | target |",
            "|---|---:|---:|---:|---|",
        ]
        for r in data["starts"]:
            target = "p50 < 100 ms" if "Redis" in r["case"] else "(today about 290 ms)"
            lines.append(
                f"| {r['case']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_ms']:.0f} | {target} |"
            )
        redis = next((r for r in data["starts"] if "Redis" in r["case"]), None)
        if redis:
            lines += [
                "",
                f"Target p50 < 100 ms on PostgreSQL + Redis: {_met(redis['p50_ms'] < 100)}.",
            ]
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> None:
    write_marked_section("inflight", text)
