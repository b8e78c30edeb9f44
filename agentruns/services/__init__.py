"""User actions on runs, one `do_*`-style function each, atomic, audited on the run's timeline:
starting one (`start`: start, execute inline, fork, with what a fork repeats in `forks`),
acting on one that exists (`actions`: cancel, stop, retry, resolve a step) and across runs
(`operations`: allow one more execution of an operation key). The views, the API and the chat
call them from here."""

from agentruns.runtime.access.quotas import QuotaExceeded
from agentruns.runtime.execution.transitions import ActionRefused
from agentruns.services.actions import (
    cancel_run,
    may_stop,
    resolve_step,
    retry_run,
    stop_for,
    stop_run,
)
from agentruns.services.forks import ForkPlan
from agentruns.services.forks import plan as fork_plan
from agentruns.services.operations import allow_operation
from agentruns.services.start import (
    StartResult,
    check_priority,
    execute_inline,
    fork_run,
    may_prioritise,
    start_run,
)

__all__ = [
    "ActionRefused",
    "ForkPlan",
    "QuotaExceeded",
    "StartResult",
    "allow_operation",
    "cancel_run",
    "check_priority",
    "execute_inline",
    "fork_plan",
    "fork_run",
    "may_prioritise",
    "may_stop",
    "resolve_step",
    "retry_run",
    "start_run",
    "stop_for",
    "stop_run",
]
