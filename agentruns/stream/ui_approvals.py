"""The approval part of the run's fold into AI SDK chunks (`ui_chunks.UIChunks`).

A tool call that waits for a person shows in the chat as `tool-approval-request`; each approval
given (one of several, or an edit) asks again under the approvalId `<approval>.<version>`; the
decision, wherever it was made, appears as `tool-approval-response` then the output or
`tool-output-denied`; a withdrawn request ends the call with an error. The same rules as the rest
of the fold hold here: every event only appends chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    """A tool call's part in the assistant message, by the step that runs it."""

    tool_call_id: str
    tool: str
    settled: bool = False  # output, error or denial emitted: later decisions change nothing
    answered: bool = False  # a question's answer is its output (its step's success repeats it)


class ApprovalFolding:
    """The approval events' handlers; the state and `_emit` are the fold's (`UIChunks`)."""

    run_id: str
    count: int
    in_segment: bool
    calls: dict[int, ToolCall]
    approval_steps: dict[int, int]
    approval_chunks: dict[int, int]
    request_chunks: dict[str, int]
    asked_as: dict[int, str]
    _emit: Callable[[dict[str, Any]], None]
    _close_text: Callable[[], None]
    _shown: Callable[[str, Any], Any]

    def _approval_requested(self, data: dict) -> None:
        if data.get("kind") == "question" and data.get("approval") is not None:
            # the call's part stays awaiting its output, which the chat may give (addToolOutput,
            # api/chat_questions.py); its answer, from any door, is the call's output
            self.approval_chunks[int(data["approval"])] = self.count + (0 if self.in_segment else 1)
            return
        if data.get("kind", "approval") != "approval" or data.get("approval") is None:
            return  # a reconciliation is staff's business in the inbox, not the chat's
        call = self.calls.get(int(data.get("step", -1)))
        if call is None:
            return
        approval = int(data["approval"])
        self.approval_steps[approval] = int(data["step"])
        self._close_text()
        self._ask(approval, str(approval), call)

    def _ask(self, approval: int, asked_as: str, call: ToolCall) -> None:
        self.approval_chunks[approval] = self.count + (0 if self.in_segment else 1)
        self.request_chunks[asked_as] = self.approval_chunks[approval]
        self.asked_as[approval] = asked_as
        self._emit(
            {
                "type": "tool-approval-request",
                "approvalId": asked_as,
                "toolCallId": call.tool_call_id,
            }
        )

    def _approval_given(self, data: dict) -> None:
        """One of several approvals, or an edit: the proposal has a new version. The chat is
        asked again, with the current arguments, under an approvalId naming that version
        (`"<approval>.<version>"`), so an answer to what it showed before cannot approve it."""
        approval, version = data.get("approval"), data.get("version")
        step = self.approval_steps.get(int(approval)) if approval is not None else None
        call = self.calls.get(step) if step is not None else None
        if call is None or call.settled or not isinstance(version, int):
            return  # not this chat's request (or an event from before versions)
        opened_here = not self.in_segment
        self._emit(
            {
                "type": "tool-input-available",
                "toolCallId": call.tool_call_id,
                "toolName": call.tool,
                "input": self._shown(call.tool, data.get("arguments", {})),
            }
        )
        self._ask(int(approval), f"{int(approval)}.{version}", call)
        if opened_here:  # the run is still parked: this re-ask is a segment of its own
            metadata = {"runId": str(self.run_id), "status": "waiting"}
            self._emit(
                {"type": "finish", "finishReason": "tool-calls", "messageMetadata": metadata}
            )
            self.in_segment = False

    def _approval_decided(self, data: dict) -> None:
        call = self.calls.get(int(data.get("step", -1)))
        if call is None or call.settled:
            return
        decision = str(data.get("decision") or "")
        if data.get("kind") == "question":
            # answered while the run is parked: the answer is the call's output at once (the
            # chat's continuation starts here)
            self._emit(
                {
                    "type": "tool-output-available",
                    "toolCallId": call.tool_call_id,
                    "output": str(data.get("answer") or ""),
                }
            )
            call.settled = call.answered = True
            return
        if data.get("kind") == "reconciliation":
            resolution = data.get("resolution")
            if resolution == "happened":
                output = data.get("result") or {"reconciled": True, "happened": True}
                self._emit(
                    {
                        "type": "tool-output-available",
                        "toolCallId": call.tool_call_id,
                        "output": self._shown(call.tool, output),
                    }
                )
                call.settled = True
            elif resolution == "abort":
                self._emit(
                    {
                        "type": "tool-output-error",
                        "toolCallId": call.tool_call_id,
                        "errorText": f"aborted by {data.get('by') or 'staff'}: outcome unknown",
                    }
                )
                call.settled = True
            return
        approval = data.get("approval")
        if decision not in ("approved", "rejected", "expired"):
            return  # not final (e.g. one of several required approvals)
        approved = decision == "approved"
        if approval is not None and int(approval) in self.approval_steps:
            reason = f"{decision} by {data.get('by') or 'the system'}"
            if data.get("reason") and data.get("reason") != decision:
                reason += f": {data['reason']}"
            self._emit(
                {
                    "type": "tool-approval-response",
                    "approvalId": self.asked_as.get(int(approval), str(approval)),
                    "approved": approved,
                    "reason": reason,
                }
            )
        if not approved:
            self._emit({"type": "tool-output-denied", "toolCallId": call.tool_call_id})
            call.settled = True

    def _approval_withdrawn(self, data: dict) -> None:
        step = self.approval_steps.get(int(data.get("approval") or -1))
        call = self.calls.get(step) if step is not None else None
        if call is not None and not call.settled:
            self._emit(
                {
                    "type": "tool-output-error",
                    "toolCallId": call.tool_call_id,
                    "errorText": "not run: the approval request was withdrawn",
                }
            )
            call.settled = True
