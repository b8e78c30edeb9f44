"""User actions on runs, one `do_*`-style function each, atomic, audited on the run's timeline:
starting one (`start`: start, execute inline, fork) and acting on one that exists (`actions`:
cancel, retry, resolve a step). The views, the API and the chat call them from here."""

from agentruns.runtime.access.quotas import QuotaExceeded
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.services.actions import cancel_run, resolve_step, retry_run
from agentruns.services.start import (
    KeyInUse,
    StartResult,
    check_priority,
    execute_inline,
    fork_run,
    start_run,
)

__all__ = [
    "ActionRefused",
    "KeyInUse",
    "QuotaExceeded",
    "StartResult",
    "cancel_run",
    "check_priority",
    "execute_inline",
    "fork_run",
    "resolve_step",
    "retry_run",
    "start_run",
]
