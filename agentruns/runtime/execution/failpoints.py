"""Failpoints in the spirit of TiKV's fail-rs (DESIGN.md 6).

AGENTRUNS_FAILPOINTS="step_started:issue_refund=crash_once,model_streaming=crash"
points: step_started, tool_returned, step_persisted, model_streaming
actions: crash (hard exit, like SIGKILL), crash_once (once per step, remembered on disk), off
"""

from __future__ import annotations

import os
import signal
from functools import lru_cache
from pathlib import Path

from agentruns.conf import conf

POINTS = {"step_started", "tool_returned", "step_persisted", "model_streaming"}
ACTIONS = {"crash", "crash_once", "off"}


@lru_cache(maxsize=8)
def _parse(spec: str) -> dict[tuple[str, str | None], str]:
    table: dict[tuple[str, str | None], str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        target, _, action = item.partition("=")
        point, _, tool = target.partition(":")
        if point not in POINTS or action not in ACTIONS:
            raise ValueError(
                f"bad failpoint {item!r}: points {sorted(POINTS)}, actions {sorted(ACTIONS)}"
            )
        table[(point, tool or None)] = action
    return table


def _spec() -> str:
    return os.environ.get("AGENTRUNS_FAILPOINTS", conf.FAILPOINTS)


def hit(point: str, *, tool: str | None = None, step_id: object = None) -> None:
    """Called by the engine at each point; does nothing unless the variable names it."""
    spec = _spec()
    if not spec:
        return
    table = _parse(spec)
    action = table.get((point, tool)) or table.get((point, None))
    if action is None or action == "off":
        return
    if action == "crash_once":
        marker = Path(conf.FAILPOINT_DIR) / f"{point}-{tool or 'any'}-{step_id}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644)
        os.fsync(fd)
        os.close(fd)
    # a hard exit: no finally blocks, no atexit, no transaction cleanup, exactly like SIGKILL
    os.kill(os.getpid(), signal.SIGKILL)
