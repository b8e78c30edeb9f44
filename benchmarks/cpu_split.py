"""CPU seconds of the parts of a benchmark, from /proc (Linux): which process spent the cores.

`CpuSplit` snapshots, for a batch: the benchmark's own process (the 8 start threads), the worker
(every process of the `qcluster`'s process group) and the PostgreSQL server (the postmaster and
every backend; the exited ones through the postmaster's children's times). On a 2-core machine
the batch cannot end before (sum of these) / 2: that is the CPU floor of its wall time.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on


def _cpu(fields: list[str], children: bool) -> float:
    # utime, stime (fields 14, 15); cutime, cstime (16, 17): index = field - 3
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def _processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            found.append((int(entry), fields))
    return found


def group_cpu(pgid: int) -> float:
    """Every process of process group `pgid`, with the times of its reaped children."""
    return sum(_cpu(f, children=True) for _, f in _processes() if int(f[2]) == pgid)


def group_processes(pgid: int) -> dict[int, int]:
    """The processes of process group `pgid`: {pid: its parent's pid}."""
    return {pid: int(f[1]) for pid, f in _processes() if int(f[2]) == pgid}


def server_cpu(backend_pid: int) -> float:
    """The PostgreSQL server that `backend_pid` (a backend's pid) belongs to."""
    fields = _stat(backend_pid)
    if fields is None:
        return 0.0
    postmaster = int(fields[1])  # ppid
    own = _stat(postmaster)
    total = _cpu(own, children=True) if own else 0.0
    return total + sum(_cpu(f, children=False) for _, f in _processes() if int(f[1]) == postmaster)


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuSplit:
    def __init__(self, worker_pgid: int, backend_pid: int) -> None:
        self.worker_pgid, self.backend_pid = worker_pgid, backend_pid
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        return {
            "starter (this process)": self_cpu(),
            "worker (qcluster and its processes)": group_cpu(self.worker_pgid),
            "PostgreSQL (postmaster and backends)": server_cpu(self.backend_pid),
        }

    def since(self) -> dict[str, float]:
        after = self._now()
        return {k: after[k] - self.before[k] for k in after}


class StatementCounts:
    """What the server executed during the batch, per run, by statement (pg_stat_statements, if
    the server preloads it: PG_EXTRA_OPTS="-c shared_preload_libraries=pg_stat_statements
    -c pg_stat_statements.track_planning=on"); nothing otherwise."""

    def __init__(self) -> None:
        from django.db import connection

        self.on = False
        try:
            with connection.cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                cursor.execute("SELECT pg_stat_statements_reset()")
            self.on = True
        except Exception:  # not preloaded: no counts
            connection.close()

    def top(self, runs: int, most: int = 12) -> list[str]:
        if not self.on:
            return []
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT calls, total_exec_time, total_plan_time, left(regexp_replace(query, "
                "'\\s+', ' ', 'g'), 90) FROM pg_stat_statements ORDER BY "
                "total_exec_time + total_plan_time DESC"
            )
            rows = cursor.fetchall()
        calls = sum(r[0] for r in rows)
        exec_ms = sum(r[1] for r in rows)
        plan_ms = sum(r[2] for r in rows)
        lines = [
            f"Statements: {calls / runs:.1f} a run; executing {exec_ms / runs:.1f} ms a run, "
            f"planning {plan_ms / runs:.1f} ms a run (server time, waits included)",
            "",
            "| statement | calls a run | exec ms a run | plan ms a run |",
            "|---|---:|---:|---:|",
        ]
        for n, ex, pl, text in rows[:most]:
            text = text.replace("|", "\\|")
            lines.append(f"| `{text}` | {n / runs:.2f} | {ex / runs:.2f} | {pl / runs:.2f} |")
        return [*lines, ""]
