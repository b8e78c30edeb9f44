"""The conversation sent to the model, rebuilt from persisted steps only.

A resumed run therefore sends exactly what an uninterrupted one would have sent: the system
prompt, the input, then every model turn and every tool result in step order.
"""

from __future__ import annotations

import json
from typing import Any

from agentruns.models import Run, Step, StepKind, StepStatus


def input_message(agent: Any, run: Run) -> str:
    formatter = getattr(agent, "format_input", None)
    if callable(formatter):
        return formatter(run.input)
    return json.dumps(run.input, sort_keys=True, ensure_ascii=False)


def opening_messages(agent: Any, run: Run) -> list[dict]:
    return [
        {"role": "system", "content": agent.instructions},
        {"role": "user", "content": input_message(agent, run)},
    ]


def tool_result_content(step: Step) -> str:
    if step.status == StepStatus.SUCCEEDED:
        payload = step.result
    elif step.status == StepStatus.REJECTED:
        payload = step.result or {"error": "rejected", "reason": step.error}
    else:
        payload = {"error": step.error or step.status}
    return json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)


def step_messages(step: Step) -> list[dict]:
    if step.kind == StepKind.MODEL:
        message: dict = {"role": "assistant", "content": step.text or None}
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in step.tool_calls
            ]
        return [message]
    return [{"role": "tool", "tool_call_id": step.call_id, "content": tool_result_content(step)}]


class Conversation:
    """Messages for the model, extended incrementally as steps finish (no re-reads)."""

    def __init__(self, agent: Any, run: Run) -> None:
        self.messages = opening_messages(agent, run)
        self._upto = 0  # steps[:_upto] are already in `messages`

    def extend(self, steps: list[Step]) -> list[dict]:
        """Bring messages up to date; every step in `steps` must be terminal."""
        for step in steps[self._upto :]:
            self.messages.extend(step_messages(step))
        self._upto = len(steps)
        return self.messages
