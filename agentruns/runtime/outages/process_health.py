"""What this process saw of its dependencies: database and Redis reachability (the process's
`weather` outages, the one record of them), model errors.

Kept in memory per process (a few counters behind a lock) and reported where the process can:
a worker's run pool writes the snapshot into its heartbeat row (`WorkerHeartbeat.process_health`,
every few seconds), the web process adds its own live view when it renders /metrics. A process
that cannot reach the database cannot report that through the database: its heartbeat goes
stale (`agentruns_worker_heartbeat_age_seconds`), and once it reaches it again the errors it
counted meanwhile arrive with the next beat.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from agentruns.conf import conf
from agentruns.runtime.outages import weather

_lock = threading.Lock()
_model_errors: dict[str, int] = {}
_STATUS = re.compile(r"\b(429|5\d\d|4\d\d)\b")


def model_error_class(exc: BaseException) -> str:
    """A small closed set of labels: rate_limited, server_error, client_error, timeout,
    connection, other (a label per message would be an unbounded metric)."""
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    text = f"{status or ''} {exc}"
    cause: BaseException | None = exc
    while cause is not None:
        name = type(cause).__name__.lower()
        if "timeout" in name:
            return "timeout"
        if "connect" in name or "refused" in name or isinstance(cause, ConnectionError):
            return "connection"
        cause = cause.__cause__ or cause.__context__
    match = _STATUS.search(text)
    if match:
        code = int(match.group(1))
        if code == 429:
            return "rate_limited"
        return "server_error" if code >= 500 else "client_error"
    return "other"


def model_error(exc: BaseException) -> None:
    label = model_error_class(exc)
    with _lock:
        _model_errors[label] = _model_errors.get(label, 0) + 1


def snapshot() -> dict[str, Any]:
    with _lock:
        model_errors = dict(_model_errors)
    return {
        "database": weather.database.state(),
        # no Redis configured: nothing to report (the metric is absent, not "up")
        "redis": weather.redis.state() if conf.REDIS_URL else {"up": None},
        "model_errors": model_errors,
    }
