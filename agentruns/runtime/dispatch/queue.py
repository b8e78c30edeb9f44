"""The doorbell: a django-q2 task that tells some worker "this run has work".

The task is only a wake-up call (at-least-once, possibly duplicated); the run's lease decides
who executes (DESIGN.md 4.1). With the ORM broker the task row is written in the caller's
transaction, so a rolled-back change rings no bell.
"""

from __future__ import annotations

import uuid
from datetime import datetime

# stored in queue rows: renaming it strands every queued task
ADVANCE_TASK = "agentruns.tasks.advance_run"


def enqueue(run_id: uuid.UUID | str, *, not_before: datetime | None = None) -> None:
    """Ring now, or at `not_before` (a delayed doorbell: the run waits without a thread)."""
    from django_q.tasks import async_task  # q2 reads its settings on import: only when ringing

    extra = {}
    if not_before is not None:
        from agentruns.runtime.dispatch.broker import DoorbellBroker  # imports q2 as well

        extra["broker"] = DoorbellBroker.ring_at(not_before)
    async_task(ADVANCE_TASK, str(run_id), task_name=f"run-{run_id}"[:100], **extra)
