"""A run's events as the AI SDK's UI message stream: one fold, so a chunk index is a cursor.

The AI SDK (`ai` 7.x, `uiMessageChunkSchema`) renders an assistant message from a sequence of
chunks. `UIChunks` turns a run's events, fed in seq order, into that sequence; every reader
(the chat POST, a resume GET with `startIndex`, any number of tabs) runs the same fold over the
same gap-free events, so chunk N is the same chunk for all of them, now and later. Three rules
make that hold:

1. **A fold, never a revision.** Each event only appends chunks; nothing emitted is recomputed
   from later events. So the chunks of events 1..k are a prefix of the chunks of 1..k+j, and an
   index counted by any reader (our readers, the AI SDK's WorkflowAgent-style transports,
   a person's `startIndex=`) stays valid forever. The fold reads only the events and the run's
   frozen tool snapshot (for redaction), both immutable: a fresh reader rebuilds it exactly.
2. **Supersession is an appended chunk, not a hole.** Model text streams live, one
   `text-delta` per persisted `model.delta`. A crash mid-stream (or a retried model error)
   voids that attempt's text: the runtime appends `model.superseded`, and the fold answers
   with `reset-step`, which the AI SDK defines as "remove every part added during the current
   step". Each model turn is one AI SDK step (`start-step` ... `finish-step`) whose only parts
   before the turn completes are that attempt's text, so the reset removes exactly the void
   text, and the next attempt streams a fresh text part (`text-<step>-<attempt>`). A reader
   that saw the half text live and one that arrives later both receive the same chunks and
   both end with the same message: no half text part survives, and no index moves. (Emitting
   text only once its attempt is known final would also be stable, but would show nothing
   until each turn ends; `reset-step` keeps the stream live.) The same applies when a model
   turn fails for good or the run ends in the middle of a turn: the unfinished text is reset.
3. **Tool parts exist before anything refers to them.** `tool-input-available` comes from
   `step.planned` (its arguments ride in the event, redacted), in the model step that asked
   for the call; the approval request, the output, the error or the denial follow by the
   step's id, which is the `toolCallId`.

Segments: a run can stop and continue (it parks for an approval, fails and is retried). Each
stretch is `start` ... `finish` (finishReason `tool-calls` when it parked, `stop`, `error`
after an `error` chunk, or `other` when cancelled, after an `abort` chunk when it was stopped:
the text its cut-short model turn streamed stays), with the same `messageId`, so a
continuation extends the same assistant message; readers end their HTTP stream at a `finish`
that is the last chunk so far. A decision, wherever it was made (the chat, the inbox, the
sweeper's expiry), appears as `tool-approval-response` and then the tool's output or
`tool-output-denied`. While a call waits for several approvers, each approval given makes a new
version of the proposal (approvals/domain/outcomes.py): the fold asks again in a segment of its own
(the call's `tool-input-available` with the current arguments, then `tool-approval-request`
under the approvalId `<approval>.<version>`), so an answer to an older request names what it saw. (Those
handlers: `ui_approvals.py`.)

Only chunk types and fields that `uiMessageChunkSchema` of the pinned `ai` major defines are
emitted (`reset-step` and `tool-approval-response` are 7.x chunks).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentruns.runtime.events import EventType
from agentruns.runtime.values.redaction import redact_fields
from agentruns.runtime.values.text import printable
from agentruns.stream.ui_approvals import ApprovalFolding, ToolCall

Chunk = dict[str, Any]

FINISH_REASONS = {
    "waiting": "tool-calls",
    "succeeded": "stop",
    "failed": "error",
    "cancelled": "other",
}


def message_id(run_id: uuid.UUID | str) -> str:
    """The assistant message a run renders as (every segment extends this one message)."""
    return f"run-{run_id}"


def encode_chunk(chunk: Chunk) -> str:
    """One SSE frame of the UI message stream. Printable, as the socket's frames are: a stored
    lone surrogate (SQLite keeps one) must not stop the stream, it cannot be sent as UTF-8."""
    return f"data: {printable(json.dumps(chunk, ensure_ascii=False, separators=(',', ':')))}\n\n"


@dataclass
class UIChunks(ApprovalFolding):
    """The fold (see the module docstring). `feed` takes events in seq order, without holes."""

    run_id: str
    hidden: Callable[[str], Iterable[str]]  # tool -> fields to redact (Run.redacted_fields)
    seq: int = 0  # the last event fed
    count: int = 0  # chunks emitted so far: the index of the next chunk
    last_type: str = ""  # type of the last chunk emitted
    in_segment: bool = False
    open_step: int | None = None  # the model step whose start-step is open
    text: tuple[int, int] | None = None  # (step, attempt) of the open text part
    step_text: tuple[int, int] | None = None  # attempt whose text is in the open step
    newest: dict[int, int] = field(default_factory=dict)  # step -> newest attempt seen
    superseded: set[tuple[int, int]] = field(default_factory=set)
    calls: dict[int, ToolCall] = field(default_factory=dict)  # tool step index -> its part
    approval_steps: dict[int, int] = field(default_factory=dict)  # approval id -> step index
    approval_chunks: dict[int, int] = field(default_factory=dict)  # approval id -> chunk index
    # the chat's approvalId of each request made: "14" (version 1) or "14.3" -> its chunk index
    request_chunks: dict[str, int] = field(default_factory=dict)
    asked_as: dict[int, str] = field(default_factory=dict)  # approval id -> the latest approvalId
    finish_chunks: list[int] = field(default_factory=list)  # indexes of the finish chunks
    _out: list[Chunk] = field(default_factory=list)

    # ---------------------------------------------------------------- reading
    @property
    def ended(self) -> bool:
        """The last chunk so far is a `finish`: the run parked or ended (readers stop here)."""
        return self.last_type == "finish"

    def continuation_index(self, approval_id: int) -> int | None:
        """Where a reader whose message ends at the stop that asked for `approval_id` picks up:
        the chunk after the first `finish` that follows that approval request."""
        asked = self.approval_chunks.get(approval_id)
        if asked is None:
            return None
        return self._after_finish(asked)

    def continuation_of_request(self, chat_approval_id: str) -> int | None:
        """The same for the request a reader answered, by its approvalId: after a stale answer
        (`"14"` while the proposal is now `"14.3"`) the reader gets every re-ask since."""
        asked = self.request_chunks.get(chat_approval_id)
        return None if asked is None else self._after_finish(asked)

    def _after_finish(self, asked: int) -> int:
        return next((f + 1 for f in self.finish_chunks if f > asked), self.count)

    # ---------------------------------------------------------------- the fold
    def feed(self, seq: int, etype: str, data: dict) -> list[Chunk]:
        """The chunks event `seq` appends (possibly none)."""
        if seq != self.seq + 1:
            raise ValueError(f"event {seq} fed after {self.seq}: the fold needs every event")
        self.seq = seq
        self._out = []
        handler = _HANDLERS.get(etype)
        if handler is not None:
            handler(self, data or {})
        out = self._out
        self._out = []
        return out

    def _emit(self, chunk: Chunk) -> None:
        if not self.in_segment and chunk["type"] != "start":
            self._start()
        if chunk["type"] == "finish":
            self.finish_chunks.append(self.count)
        self._out.append(chunk)
        self.count += 1
        self.last_type = chunk["type"]

    def _start(self) -> None:
        self.in_segment = True
        self._emit(
            {
                "type": "start",
                "messageId": message_id(self.run_id),
                "messageMetadata": {"runId": str(self.run_id)},
            }
        )

    def _shown(self, tool: str, value: Any) -> Any:
        return redact_fields(value, self.hidden(tool))

    # ---------------------------------------------------------------- text and steps
    def _close_text(self) -> None:
        if self.text is not None:
            step, attempt = self.text
            self._emit({"type": "text-end", "id": _text_id(step, attempt)})
            self.text = None

    def _void_step_text(self) -> None:
        """The open step's text belongs to an attempt that will never complete: remove it."""
        if self.step_text is not None:
            self._emit({"type": "reset-step"})
            self.superseded.add(self.step_text)
        self.text = self.step_text = None

    def _enter_step(self, step: int) -> None:
        if self.open_step == step and self.in_segment:
            return
        self._leave_step()
        self._emit({"type": "start-step"})
        self.open_step = step

    def _leave_step(self) -> None:
        if self.open_step is None:
            return
        self._close_text()
        if self.in_segment:
            self._emit({"type": "finish-step"})
        self.open_step, self.step_text = None, None

    def _delta(self, data: dict) -> None:
        step, attempt = int(data.get("step", 0)), int(data.get("attempt", 0))
        if (step, attempt) in self.superseded or attempt < self.newest.get(step, 0):
            return
        if attempt > self.newest.get(step, 0):
            self.newest[step] = attempt
            if self.step_text is not None and self.step_text[0] == step:
                self._void_step_text()  # a newer attempt streams: the older one is void
        text = data.get("text") or ""
        if not text:
            return
        self._enter_step(step)
        if self.text != (step, attempt):
            self._close_text()
            self._emit({"type": "text-start", "id": _text_id(step, attempt)})
            self.text = self.step_text = (step, attempt)
        self._emit({"type": "text-delta", "id": _text_id(step, attempt), "delta": text})

    def _superseded(self, data: dict) -> None:
        key = (int(data.get("step", 0)), int(data.get("attempt", 0)))
        if self.step_text == key:
            self._void_step_text()
        self.superseded.add(key)

    def _step_started(self, data: dict) -> None:
        if data.get("kind") == "model":
            self._enter_step(int(data.get("step", 0)))

    def _step_succeeded(self, data: dict) -> None:
        if data.get("kind") == "model":
            final = (int(data.get("step", 0)), int(data.get("attempts", 0)))
            if self.step_text is not None and self.step_text != final:
                self._void_step_text()  # the attempt that completed streamed nothing of its own
            self._close_text()
            return
        self._output(data)  # also after an earlier failure: a retried call's result replaces it

    def _output(self, data: dict) -> None:
        call = self.calls.get(int(data.get("step", -1)))
        if call is not None and not call.answered:
            output = self._shown(call.tool, data.get("result"))
            self._emit(
                {"type": "tool-output-available", "toolCallId": call.tool_call_id, "output": output}
            )
            call.settled = True

    def _step_failed(self, data: dict) -> None:
        if data.get("kind") == "model":
            self._void_step_text()  # the turn failed for good: its text is void
            return
        call = self.calls.get(int(data.get("step", -1)))
        if call is not None:
            error = str(data.get("error") or "the tool call failed")
            self._emit(
                {"type": "tool-output-error", "toolCallId": call.tool_call_id, "errorText": error}
            )
            call.settled = True

    def _planned(self, data: dict) -> None:
        step, tool = int(data.get("step", 0)), str(data.get("tool") or "unknown")
        self._close_text()
        call = ToolCall(tool_call_id=str(data.get("id") or f"step-{step}"), tool=tool)
        self.calls[step] = call
        chunk: Chunk = {
            "toolCallId": call.tool_call_id,
            "toolName": tool,
            "input": self._shown(tool, data.get("arguments", {})),
        }
        if data.get("error"):  # refused before it ran (unknown tool, bad arguments)
            self._emit({"type": "tool-input-error", **chunk, "errorText": str(data["error"])})
            call.settled = True
        else:
            self._emit({"type": "tool-input-available", **chunk})

    # ---------------------------------------------------------------- the run
    def _run_created(self, data: dict) -> None:
        if not self.in_segment:
            self._start()

    def _run_status(self, data: dict) -> None:
        status = str(data.get("status") or "")
        reason = FINISH_REASONS.get(status)
        if reason is None:
            return  # queued / running: the run goes on
        if self.text is not None:
            self._void_step_text()  # it ended inside a model turn: that text never completed
        self._leave_step()
        metadata: dict[str, Any] = {"runId": str(self.run_id), "status": status}
        if status == "failed":
            error = str(data.get("error") or "the run failed")
            self._emit({"type": "error", "errorText": error})
            metadata["error"] = error
        if data.get("stop_reason") == "stopped":  # its starter or an operator stopped it
            metadata["stopReason"] = "stopped"
            self._emit({"type": "abort", "reason": "stopped"})
        self._emit({"type": "finish", "finishReason": reason, "messageMetadata": metadata})
        self.in_segment = False


def _text_id(step: int, attempt: int) -> str:
    return f"text-{step}-{attempt}"


_HANDLERS: dict[str, Callable[[UIChunks, dict], None]] = {
    EventType.RUN_CREATED: UIChunks._run_created,
    EventType.RUN_STATUS: UIChunks._run_status,
    EventType.MODEL_DELTA: UIChunks._delta,
    EventType.MODEL_SUPERSEDED: UIChunks._superseded,
    EventType.STEP_STARTED: UIChunks._step_started,
    EventType.STEP_PLANNED: UIChunks._planned,
    EventType.STEP_SUCCEEDED: UIChunks._step_succeeded,
    EventType.STEP_FAILED: UIChunks._step_failed,
    EventType.STEP_RESOLVED: UIChunks._output,
    EventType.STEP_SKIPPED: UIChunks._step_failed,  # the chat sees why the call was not made
    EventType.APPROVAL_REQUESTED: UIChunks._approval_requested,
    EventType.APPROVAL_GIVEN: UIChunks._approval_given,
    EventType.APPROVAL_DECIDED: UIChunks._approval_decided,
    EventType.APPROVAL_WITHDRAWN: UIChunks._approval_withdrawn,
}


def chunks_of(
    run_id: uuid.UUID | str,
    events: Iterable[tuple[int, str, dict]],
    hidden: Callable[[str], Iterable[str]] = lambda tool: (),
) -> list[Chunk]:
    """Every chunk of a sequence of (seq, type, data) events (tests, one-shot reads)."""
    fold = UIChunks(str(run_id), hidden)
    return [chunk for seq, etype, data in events for chunk in fold.feed(seq, etype, data)]
