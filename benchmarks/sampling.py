"""What a latency-bound benchmark samples while its runs are in flight: the resident memory of
the processes doing the work and the PostgreSQL connections they hold (by application_name, so
the harness's own connections do not count); and, for concurrency keys, how many runs of one key
run (or hold it) at once. No Django: peers import it too."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


class Sampler(threading.Thread):
    """Every `interval` seconds: the largest RSS among `pids` and the connections whose
    application_name starts with `app`; `peak()` since the last `reset()`."""

    def __init__(self, dsn: str, app: str, pids: list[int], interval: float = 0.05) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.dsn, self.app, self.pids, self.interval = dsn, app, list(pids), interval
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with getattr(self, "lock", threading.Lock()):
            self.max_rss = 0.0
            self.max_connections = 0

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopped.is_set():
                (connections,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                    [self.app + "%"],
                ).fetchone()
                rss = max((rss_mb(pid) for pid in self.pids), default=0.0)
                with self.lock:
                    self.max_connections = max(self.max_connections, connections)
                    self.max_rss = max(self.max_rss, rss)
                time.sleep(self.interval)

    def peak(self) -> tuple[float, int]:
        with self.lock:
            return self.max_rss, self.max_connections

    def stop(self) -> None:
        self.stopped.set()


class KeySampler(threading.Thread):
    """Every `interval` seconds, from a connection of its own: per concurrency key of `agent`,
    how many of its runs are `running` and how many hold the key, keeping the largest counts
    seen (`peaks`) and how many samples it took. What the key's limit promises, read from the
    database while a real cluster works."""

    SQL = (
        "SELECT concurrency_key, count(*) FILTER (WHERE status = 'running'), "
        "count(*) FILTER (WHERE holds_key) FROM agentruns_run "
        "WHERE agent = %s AND concurrency_key IS NOT NULL "
        "AND status IN ('queued', 'running', 'waiting') GROUP BY concurrency_key"
    )

    def __init__(self, dsn: str, agent: str, interval: float = 0.05) -> None:
        super().__init__(name="key-sampler", daemon=True)
        self.dsn, self.agent, self.interval = dsn, agent, interval
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.samples = 0
        self.most_running: dict[str, int] = {}
        self.most_holding: dict[str, int] = {}

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopped.is_set():
                rows = conn.execute(self.SQL, [self.agent]).fetchall()
                with self.lock:
                    self.samples += 1
                    for key, running, holding in rows:
                        self.most_running[key] = max(self.most_running.get(key, 0), running)
                        self.most_holding[key] = max(self.most_holding.get(key, 0), holding)
                time.sleep(self.interval)

    def peaks(self) -> tuple[int, int, int]:
        """(samples taken, the most runs running on one key, the most holding one key)."""
        with self.lock:
            running = max(self.most_running.values(), default=0)
            return self.samples, running, max(self.most_holding.values(), default=0)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


def with_app(dsn: str, app: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={app}"


def pct(values: list[float], p: float) -> float:
    """The p-th percentile of `values` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
