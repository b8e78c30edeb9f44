"""The doorbell: a django-q2 task that tells some worker "this run has work".

The task is only a wake-up call (at-least-once, possibly duplicated); the run's lease decides
who executes (DESIGN.md 4.1). With the ORM broker the task row is written in the caller's
transaction, so a rolled-back change rings no bell.
"""

from __future__ import annotations

import uuid

# stored in queue rows: renaming it strands every queued task
ADVANCE_TASK = "agentruns.tasks.advance_run"


def enqueue(run_id: uuid.UUID | str) -> None:
    from django_q.tasks import async_task  # q2 reads its settings on import: only when ringing

    async_task(ADVANCE_TASK, str(run_id), task_name=f"run-{run_id}"[:100])
