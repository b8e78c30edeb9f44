"""Reads for pages, the API and the stream: one definition of each query."""

from agentruns.selectors.conversation import Turn, live_turns
from agentruns.selectors.run_list import AGES, RunFilters, run_page
from agentruns.selectors.runs import (
    backoff_of,
    events_after,
    get_run,
    nav_counts,
    run_by_dedupe_key,
    run_step,
    run_steps,
    waiting_line,
)

__all__ = [
    "AGES",
    "RunFilters",
    "Turn",
    "backoff_of",
    "events_after",
    "get_run",
    "live_turns",
    "nav_counts",
    "run_by_dedupe_key",
    "run_page",
    "run_step",
    "run_steps",
    "waiting_line",
]
