"""What the engine and a model request hand each other: the request's rate-limit slot, its usage
and its failure."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

# the moment (time.time()) a model request under a rate limit may leave, its slot
# (runtime/access/model_limits.py): the OpenAI-compatible client waits for it at the wire
# (openai_compatible._SlottedWire); other models are sent once the caller's thread has waited
NOT_BEFORE: ContextVar[float | None] = ContextVar("agentruns_not_before", default=None)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelError(Exception):
    """A model call failed. `retryable=False` fails the run with this message; a retryable one
    is an outage the run backs off from (runtime/outages/model_outage.py), not before `retry_after`
    seconds when the server said so."""

    def __init__(
        self, message: str, *, retryable: bool = True, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
