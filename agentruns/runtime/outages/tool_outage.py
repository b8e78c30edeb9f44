"""A tool's server that is down is weather, not a verdict (DESIGN.md 4.10), as a model
endpoint's is (`model_outage.py`, whose state and backoff this shares).

A call that raised `ServerUnavailable` (an MCP server that refused the connection, did not
start, or answered 429/503 before processing the call) reached nothing: it is not an attempt.
Its "before" commit is undone, the step shows `step.retry_scheduled` with `waiting_on` (the
server) and the reason, and the run backs off, capped exponential with jitter
(AGENTRUNS_MODEL_BACKOFF_SECONDS .. AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS, never sooner than a
`Retry-After`), as `queued` with the reason when the wait frees the thread. The tool's retry
policy is untouched: it is for the tool's own failures. Only after
AGENTRUNS_TOOL_OUTAGE_SECONDS of consecutive unavailability does the step fail, with a stated
reason that `retry` picks up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentruns.conf import conf
from agentruns.registry.errors import FatalToolError, ServerUnavailable
from agentruns.runtime.outages.model_outage import ModelOutage


@dataclass
class ToolOutage(ModelOutage):
    KEY: ClassVar[str] = "tool_outage"

    @property
    def budget(self) -> float:
        return conf.TOOL_OUTAGE_SECONDS

    def reason(self, exc: ServerUnavailable) -> str:  # type: ignore[override]
        return (
            f"waiting on {exc.server} ({self.failures} failed tries in {self.elapsed:.0f} s): {exc}"
        )

    def verdict(self, exc: ServerUnavailable) -> FatalToolError:  # type: ignore[override]
        return FatalToolError(
            f"{exc.server} was unavailable for {self.elapsed:.0f} s "
            f"(AGENTRUNS_TOOL_OUTAGE_SECONDS={conf.TOOL_OUTAGE_SECONDS:g}); last error: {exc}"
        )
