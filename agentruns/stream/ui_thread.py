"""A chat's UI message stream across its runs: one chunk cursor for the whole thread (issue 33).

A chat is a thread; each user message is a run, each run one assistant message (`run-<id>`).
The chat's chunks are its runs' chunks one after the other, in turn order: chunk N of the chat
is chunk N - offset(run) of the run it falls in, where a run's offset is the number of chunks
of the runs before it. A chat's runs run one at a time (its thread's line,
`runtime/dispatch/thread_line.py`; a chat's parked turn keeps the thread, `Thread.chat`), so
every run before the latest has ended and its chunk count no longer changes: the cursor is
gap-free and stays valid. (A failed run retried after a later turn began would grow under the cursor: the
thread's next turn is only queued behind an active run, and a retry of an older turn moves the
indexes of the turns after it.)
"""

from __future__ import annotations

from agentruns.models import Run
from agentruns.stream.ui_stream import chunks_until_now


def offsets(runs: list[Run]) -> list[int]:
    """Where each run's chunks begin in the chat's cursor (the last run's count is not needed)."""
    starts, total = [], 0
    for position, run in enumerate(runs):
        starts.append(total)
        if position < len(runs) - 1:
            total += chunks_until_now(run).count
    return starts


def locate(runs: list[Run], index: int) -> tuple[Run, int, int]:
    """(the run chunk `index` of the chat falls in, the index within that run, its offset)."""
    starts = offsets(runs)
    for run, start, following in zip(runs, starts, [*starts[1:], None], strict=True):
        if following is None or index < following:
            return run, max(0, index - start), start
    raise ValueError("a thread without runs")  # the callers pass at least one run
