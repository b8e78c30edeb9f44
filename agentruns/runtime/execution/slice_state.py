"""The state of one executor slice, declared: what `RunExecutor._drive` loads and its step
mixins (`model_steps.py`, `planned_steps.py`, `tool_steps.py`) read and change.

`SliceState` is built once per slice, after the run, its agent and its model are known;
`ExecutorHost` is what every mixin may rely on from the executor that carries it.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentruns.models import Run, Step
from agentruns.registry import Agent
from agentruns.runtime.dispatch.lease import Heartbeat
from agentruns.runtime.events import EventSpec
from agentruns.runtime.execution.conversation import Conversation
from agentruns.runtime.providers import ModelProvider
from agentruns.runtime.store.rows import WriteBatch


@dataclass(slots=True, eq=False)
class SliceState:
    """One slice of one run: loaded at its start, changed by every step it drives."""

    run: Run
    agent: Agent
    provider: ModelProvider
    # the tools the run's permission snapshot offers the model (DESIGN.md 4.6)
    tool_schemas: list[dict]
    steps: list[Step]
    conversation: Conversation
    # steps[:cursor] are terminal
    cursor: int = 0
    # side-effect steps whose "running + attempt" row went out in the model's commit
    begun_here: set[uuid.UUID] = field(default_factory=set)
    # the slice's first model request looked for a rate-limit slot the run reserved before it
    # backed off (runtime/access/model_limits.py)
    slot_checked: bool = False

    def next_step(self) -> Step | None:
        """The first step that is not terminal (moving the cursor past those that are); None
        when every step is."""
        steps = self.steps
        while self.cursor < len(steps) and steps[self.cursor].is_terminal:
            self.cursor += 1
        return steps[self.cursor] if self.cursor < len(steps) else None


class ExecutorHost:
    """What the step mixins rely on; `RunExecutor` provides every one of these."""

    run_id: uuid.UUID
    owner: str
    # set by the pool this executor runs in (None: executed in-process, nobody drains it)
    drain: threading.Event | None
    cancel_requested: bool
    heartbeat: Heartbeat | None
    state: SliceState

    def commit(
        self,
        events: list[EventSpec],
        *,
        batch: WriteBatch | None = None,
        end_transaction: bool = False,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
    ) -> int:
        raise NotImplementedError

    def check_lease(self) -> None:
        raise NotImplementedError

    def finish(
        self, status: str, *, output: str = "", error: str = "", stop_reason: str = ""
    ) -> str:
        raise NotImplementedError

    def park(self, *, events_before: list[EventSpec] = ()) -> str:
        raise NotImplementedError

    def back_off(self, until: Any, **why: Any) -> str:
        raise NotImplementedError

    def _wait_for_retry(self, due: Any) -> bool:
        raise NotImplementedError

    def outcome_unknown(self, step: Step, why: str) -> str:
        raise NotImplementedError
