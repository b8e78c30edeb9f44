"""The errors a tool raises on purpose (re-exported by `agentruns.registry`)."""

from __future__ import annotations

from typing import Any


class ToolError(Exception):
    """Base class for errors a tool raises on purpose."""


class RetryableToolError(ToolError):
    """A transient failure (timeout, 503): the engine retries with backoff, same idempotency key."""


class ServerUnavailable(RetryableToolError):
    """The tool's server could not take the call (refused the connection, did not start, or
    answered 429/503 before processing it): nothing of the call reached it. Weather, not an
    attempt: the step waits for the server with capped backoff and calls it again, without
    using up its retry policy (runtime/outages/tool_outage.py)."""

    def __init__(self, message: str, *, server: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.retry_after = retry_after


class FatalToolError(ToolError):
    """A permanent failure: the step fails and so does the run, with this message kept."""


class OutcomeUnknown(ToolError):
    """The call may or may not have taken effect (its connection broke after it was sent): for a
    side-effect tool that is not idempotent the step is `unknown` and a person reconciles it in
    the inbox (DESIGN.md 4.5), exactly as after a worker died mid-call. Never retried."""


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema; fed back to the model."""


class ApprovalRequested(ToolError):
    """The call needs a person's approval first (Pydantic AI's `ApprovalRequired`, raised by the
    tool): the step parks in the inbox and runs again, approved, once someone approves it."""

    def __init__(self, tool: str, metadata: Any = None) -> None:
        super().__init__(f"{tool}: the call needs approval")
        self.metadata = metadata


class UnknownAgent(LookupError):
    """No agent of that name is registered (in this process: a deploy may lack its module)."""


class UnknownTool(LookupError):
    """No tool of that name is registered."""
