"""A tool's retry policy (`@tool(retry=RetryPolicy(...))`, re-exported by `agentruns.registry`)."""

from __future__ import annotations

from dataclasses import dataclass

from agentruns import backoff
from agentruns.registry.errors import RetryableToolError


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    jitter: float = 0.25  # +- fraction of the delay
    retry_on: tuple[type[BaseException], ...] = (RetryableToolError,)

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on)

    def delay_for(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1`, after `attempt` failed (capped exponential)."""
        return backoff.delay(
            attempt, base=self.backoff_seconds, cap=self.backoff_max_seconds, jitter=self.jitter
        )

    def describe(self) -> dict:
        return {
            "max_attempts": self.max_attempts,
            "backoff_seconds": self.backoff_seconds,
            "backoff_max_seconds": self.backoff_max_seconds,
            "jitter": self.jitter,
            "retry_on": [c.__name__ for c in self.retry_on],
        }
