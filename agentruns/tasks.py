"""django-q2 entry points. q2 is only the doorbell: the run's lease decides who executes.

Their dotted paths are stored in queue and schedule rows (`runtime/dispatch/queue.ADVANCE_TASK`,
`runtime/workers/sweeper.SWEEP_TASK`): keep them where they are.
"""

from __future__ import annotations

from agentruns.runtime.values.ids import worker_name
from agentruns.runtime.workers.pool import process_pool
from agentruns.runtime.workers.sweeper import record_heartbeat, sweep


def advance_run(run_id: str) -> str:
    """Hand the run to this worker process's executor pool and return (`runtime/workers/pool.py`): the
    run executes on a pool thread, many at once. Duplicated deliveries find the lease held.
    With slots to spare, the doorbells queued behind this one are taken along."""
    pool = process_pool()
    outcome = pool.hand_over(run_id)
    if outcome == "started":
        pool.take_waiting()
    return outcome


def scheduled_sweep() -> int:
    """The django-q2 schedule: the backstop when no fast loop runs (30 s granularity)."""
    rung = sweep()
    record_heartbeat(f"schedule@{worker_name()}", swept=True)
    return rung
