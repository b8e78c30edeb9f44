"""The docs/BENCHMARKS.md section of `benchmarks/inflight.py`: its tables (the targets they are
judged by are `benchmarks/targets.py`'s, printed at the end of `make bench`)."""

from __future__ import annotations

import os
import platform

from benchmarks.docs import write_marked_section

OURS = "ours (real worker)"


def row_at(rows: list[dict], n: int) -> dict | None:
    return next((r for r in rows if r["n"] == n), None)


def _table(results: dict, extra: bool = False) -> list[str]:
    head = "| system | N | wall (s) | runs/s | x one run | peak RSS (MB) | RSS growth (MB) | peak PG connections |"
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|"
    if extra:
        head += " first delta, DB p50 (ms) | first delta, socket p50 / max (ms) |"
        rule += "---:|---:|"
    lines = [head, rule]
    for name, rows in results.items():
        one = rows[0]["wall_s"]
        for r in rows:
            line = (
                f"| {name} | {r['n']} | {r['wall_s']:.2f} | {r['n'] / r['wall_s']:.1f} | "
                f"{r['wall_s'] / one:.2f} | {r['rss_mb']:.0f} | {r['rss_growth_mb']:.0f} | "
                f"{r['pg_connections']} |"
            )
            if extra:
                db = r.get("first_delta_db_p50_ms")
                sock = r.get("first_delta_socket_p50_ms")
                line += f" {db:.0f} |" if db is not None else " - |"
                line += (
                    f" {sock:.0f} / {r['first_delta_socket_max_ms']:.0f} |"
                    if sock is not None
                    else " - |"
                )
            lines.append(line)
    return lines


def section(data: dict) -> str:
    lines = [
        "## Many runs in flight: latency-bound, side by side",
        "",
        'Command: `PG_EXTRA_OPTS=" " scripts/with-postgres.sh .venv/bin/python -m benchmarks.inflight '
        "--write-docs` (also part of `make bench`). Method in `benchmarks/inflight.py`.",
    ]
    cfg = data.get("config") or (data.get("streaming") or {}).get("config")
    if cfg:
        lines.append(
            f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
            f"{platform.python_version()}, PostgreSQL (fsync on); 1-minute load average "
            f"{os.getloadavg()[0]:.1f} when the section was written. N runs of the seven-step "
            f"refund flow started together by 8 clients. Ours: one `qcluster` with its defaults, "
            f"{cfg['q_workers']} worker processes x {cfg['per_process']} runs in flight "
            f"(AGENTRUNS_RUNS_PER_PROCESS), a psycopg pool of at most {cfg['pool_max']} "
            f"connections per process. Peers: the same concurrency "
            f"({cfg['q_workers'] * cfg['per_process']}) and {cfg['q_workers'] * cfg['pool_max']} "
            "pooled connections."
        )
    if data.get("results"):
        lines += [
            "",
            f"### Sleeping: every model turn waits {data['turn_ms']:.0f} ms, then answers",
            "",
            *_table(data["results"]),
        ]
    stream = data.get("streaming")
    if stream:
        lines += [
            "",
            f"### Streaming: every model turn streams {stream['tokens']} tokens, one every "
            f"{stream['token_ms']} ms (PostgreSQL + Redis)",
            "",
            "Ours persists the deltas (`model.delta` events every AGENTRUNS_DELTA_FLUSH_MS); the "
            "peers only wait for their tokens. First delta, DB: run created -> its first "
            "`model.delta` event, over the batch; socket: POST /api/runs -> the first "
            "`model.delta` frame on the run's WebSocket, for the runs the probe client started "
            "through the web process while the batch ran.",
            "",
            *_table(stream["results"], extra=True),
        ]
    if data.get("starts"):
        lines += [
            "",
            "### Start latency: POST /api/runs to the first model delta on the socket (one run at a time)",
            "",
            "| deployment | p50 (ms) | p99 (ms) | mean (ms) |",
            "|---|---:|---:|---:|",
        ]
        for r in data["starts"]:
            lines.append(
                f"| {r['case']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_ms']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def write_docs(text: str) -> None:
    write_marked_section("inflight", text)
