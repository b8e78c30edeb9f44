"""A model endpoint that is down is weather, not a verdict (DESIGN.md 4.10).

A model call that fails with a retryable `ModelError` (connection refused, a timeout, 5xx, 429
after the SDK's own retries) before the attempt streamed anything is not a step attempt: nothing
is written for the step, and the run backs off, capped exponential with jitter and never sooner
than the server's `Retry-After`, showing `queued` with the reason and the next try. Only after
`AGENTRUNS_MODEL_OUTAGE_SECONDS` of consecutive failures does the step fail, with a stated reason
that `retry` picks up. An answer that will not change (401, 404, 400) fails at once
(`retryable=False`, the provider's classification).

The outage outlives a slice: a run that backed off gives its thread and lease back, so its
state (which step, since when, how many failures) rides on the backing-off `run.status` event
and is read back from the latest `queued` event when the same step fails again. Any other
`queued` event in between (a retry, a time slice, a decision) starts a fresh outage.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from agentruns import backoff
from agentruns.conf import conf
from agentruns.models import RunEvent, RunStatus
from agentruns.runtime.events import EventType
from agentruns.runtime.providers import ModelError
from agentruns.runtime.values.timestamps import iso

JITTER = 0.2  # each wait is its backoff +-20%: runs that lost the same server do not return at once


def latest_queued_event(run_id: uuid.UUID | str) -> dict:
    """The data of the run's latest `queued` status event ({} when none): what a backing-off
    run carries into its next slice (an outage's state, a reserved rate-limit slot)."""
    latest = (
        RunEvent.objects.filter(
            run_id=run_id, type=EventType.RUN_STATUS, data__status=RunStatus.QUEUED
        )
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return latest if isinstance(latest, dict) else {}


@dataclass
class ModelOutage:
    """One step's outage of its dependency (a tool server's: `tool_outage.py`, a subclass)."""

    KEY: ClassVar[str] = "model_outage"  # the backing-off event's key for `state()`

    step: int  # the model step's index
    since: float  # epoch seconds of the first failure
    failures: int = 0

    @classmethod
    def resume(cls, run_id: uuid.UUID | str, step: int) -> ModelOutage:
        """The outage this step was backing off from (see the module docstring), or a new one."""
        state = latest_queued_event(run_id).get(cls.KEY)
        if isinstance(state, dict) and state.get("step") == step:
            try:
                since = datetime.fromisoformat(state["since"]).timestamp()
                return cls(step=step, since=since, failures=int(state.get("failures", 0)))
            except (KeyError, TypeError, ValueError):
                pass
        return cls(step=step, since=time.time())

    @property
    def elapsed(self) -> float:
        return max(0.0, time.time() - self.since)

    @property
    def budget(self) -> float:
        return conf.MODEL_OUTAGE_SECONDS

    def failed(self, exc: ModelError) -> float | None:
        """Count one more failure; the seconds to wait before the next try, or None when the
        outage has lasted `budget` (AGENTRUNS_MODEL_OUTAGE_SECONDS: the step fails)."""
        self.failures += 1
        left = self.budget - self.elapsed
        if left <= 0:
            return None
        wait = backoff.delay(
            self.failures,
            base=conf.MODEL_BACKOFF_SECONDS,
            cap=conf.MODEL_BACKOFF_MAX_SECONDS,
            jitter=JITTER,
        )
        if getattr(exc, "retry_after", None) is not None:
            wait = max(wait, exc.retry_after)  # the server said when; never sooner
        return min(wait, left)  # the last try comes when the budget ends

    def reason(self, exc: ModelError) -> str:
        return f"model unavailable ({self.failures} failed tries in {self.elapsed:.0f} s): {exc}"

    def verdict(self, exc: ModelError) -> ModelError:
        return ModelError(
            f"the model endpoint was unavailable for {self.elapsed:.0f} s "
            f"(AGENTRUNS_MODEL_OUTAGE_SECONDS={conf.MODEL_OUTAGE_SECONDS:g}); last error: {exc}",
            retryable=False,
        )

    def state(self) -> dict:
        """What the backing-off event carries for `resume`."""
        since = datetime.fromtimestamp(self.since, tz=UTC)
        return {"step": self.step, "since": iso(since), "failures": self.failures}
