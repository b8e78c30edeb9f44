"""The run -> AI SDK chunk mapping (agentruns/stream/ui_chunks.py) on recorded event sequences.

Event sequences come from real runs of the engine in this process (script agent, refund agent)
and, for what a crash leaves behind, from sequences written the way the runtime writes them.
Each chunk is checked against the fields `uiMessageChunkSchema` of ai 7.x knows, and applied
with the AI SDK's rules for the chunks we emit (tests/node checks the same with the real client).
"""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunEvent, Step
from agentruns.runtime.values.redaction import MASK
from agentruns.services import start_run
from agentruns.stream.ui_chunks import UIChunks, chunks_of, encode_chunk, message_id
from approvals import services as approval_services
from approvals.models import Approval
from tests.helpers import advance

pytestmark = pytest.mark.django_db

# type -> the fields ai 7.x's uiMessageChunkSchema defines for it (tests/node parses for real)
KNOWN_FIELDS = {
    "start": {"messageId", "messageMetadata"},
    "finish": {"finishReason", "messageMetadata"},
    "start-step": set(),
    "finish-step": set(),
    "reset-step": set(),
    "text-start": {"id", "providerMetadata"},
    "text-delta": {"id", "delta", "providerMetadata"},
    "text-end": {"id", "providerMetadata", "citations"},
    "error": {"errorText"},
    "tool-input-available": {"toolCallId", "toolName", "input", "dynamic", "title"},
    "tool-input-error": {"toolCallId", "toolName", "input", "errorText", "dynamic", "title"},
    "tool-approval-request": {"approvalId", "toolCallId", "reason"},
    "tool-approval-response": {"approvalId", "approved", "reason"},
    "tool-output-available": {"toolCallId", "output"},
    "tool-output-error": {"toolCallId", "errorText"},
    "tool-output-denied": {"toolCallId"},
}


class Message:
    """The assistant message as the AI SDK's processUIMessageStream builds it (our chunk types
    only), failing where the client would throw."""

    def __init__(self) -> None:
        self.id = ""
        self.parts: list[dict] = []
        self.active: dict[str, dict] = {}
        self.finish_reasons: list[str] = []
        self.errors: list[str] = []

    def tool(self, call_id: str) -> dict:
        part = next((p for p in self.parts if p.get("toolCallId") == call_id), None)
        assert part is not None, f"no tool part {call_id}"
        return part

    def apply(self, chunk: dict) -> None:
        kind = chunk["type"]
        assert set(chunk) - {"type"} <= KNOWN_FIELDS[kind], chunk
        if kind == "start":
            self.id = chunk.get("messageId", self.id)
        elif kind == "start-step":
            self.parts.append({"type": "step-start"})
        elif kind == "reset-step":
            last = max(i for i, p in enumerate(self.parts) if p["type"] == "step-start")
            del self.parts[last + 1 :]
            self.active.clear()
        elif kind == "text-start":
            part = {"type": "text", "text": "", "state": "streaming"}
            self.parts.append(part)
            self.active[chunk["id"]] = part
        elif kind == "text-delta":
            self.active[chunk["id"]]["text"] += chunk["delta"]
        elif kind == "text-end":
            self.active.pop(chunk["id"])["state"] = "done"
        elif kind == "tool-input-available" and any(
            p.get("toolCallId") == chunk["toolCallId"] for p in self.parts
        ):  # the client updates the part of that call (a proposal asked again)
            part = self.tool(chunk["toolCallId"])
            part.update(state="input-available", input=chunk["input"])
            part.pop("approval", None)
        elif kind in ("tool-input-available", "tool-input-error"):
            self.parts.append(
                {
                    "type": f"tool-{chunk['toolName']}",
                    "toolCallId": chunk["toolCallId"],
                    "input": chunk["input"],
                    "state": "input-available"
                    if kind == "tool-input-available"
                    else "output-error",
                }
            )
        elif kind == "tool-approval-request":
            part = self.tool(chunk["toolCallId"])
            part["state"], part["approval"] = "approval-requested", {"id": chunk["approvalId"]}
        elif kind == "tool-approval-response":
            part = next(
                p for p in self.parts if p.get("approval", {}).get("id") == chunk["approvalId"]
            )
            part["state"] = "approval-responded"
            part["approval"].update(approved=chunk["approved"], reason=chunk.get("reason"))
        elif kind == "tool-output-available":
            part = self.tool(chunk["toolCallId"])
            part["state"], part["output"] = "output-available", chunk["output"]
        elif kind == "tool-output-error":
            part = self.tool(chunk["toolCallId"])
            part["state"], part["errorText"] = "output-error", chunk["errorText"]
        elif kind == "tool-output-denied":
            self.tool(chunk["toolCallId"])["state"] = "output-denied"
        elif kind == "finish":
            self.finish_reasons.append(chunk.get("finishReason"))
        elif kind == "error":
            self.errors.append(chunk["errorText"])

    @property
    def texts(self) -> list[str]:
        return [p["text"] for p in self.parts if p["type"] == "text"]

    def tools(self) -> list[dict]:
        return [p for p in self.parts if p["type"].startswith("tool-")]


def recorded(run: Run) -> list[tuple[int, str, dict]]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", "type", "data"))


def chunks(run: Run) -> list[dict]:
    run.refresh_from_db()
    return chunks_of(run.id, recorded(run), run.redacted_fields)


def message(chunk_list: list[dict]) -> Message:
    msg = Message()
    for chunk in chunk_list:
        msg.apply(chunk)
    assert not msg.active, "a text part was left open"
    return msg


def script_run(*turns: dict, user=None) -> Run:
    return start_run("script", {"script": list(turns)}, user=user, enqueue_task=False).run


def model_texts(run: Run) -> list[str]:
    return [s.text for s in Step.objects.filter(run=run, kind="model").order_by("index") if s.text]


# ------------------------------------------------------------------ whole runs
def test_a_finished_run_reads_as_one_message_with_its_tool_outputs():
    run = advance(
        script_run(
            {"text": "Looking it up.", "calls": [["t_echo", {"text": "hi"}]]},
            {"text": "Charging now.", "calls": [["t_charge", {"amount": 7}]]},
            {"text": "All done: charged 7."},
        )
    )
    assert run.status == "succeeded"
    out = chunks(run)
    types = [c["type"] for c in out]
    assert types[0] == "start" and out[0]["messageId"] == message_id(run.id)
    assert types[-1] == "finish" and out[-1]["finishReason"] == "stop"
    assert types.count("start-step") == types.count("finish-step") == 3
    msg = message(out)
    assert msg.texts == model_texts(run) and msg.texts[-1] == run.output
    echo, charge = msg.tools()
    assert (echo["type"], echo["state"], echo["output"]) == (
        "tool-t_echo",
        "output-available",
        {"echo": "hi"},
    )
    assert charge["state"] == "output-available" and charge["output"]["charged"] == 7
    assert charge["input"] == {"amount": 7}
    steps = {str(s.id): s for s in Step.objects.filter(run=run)}
    assert {echo["toolCallId"], charge["toolCallId"]} <= set(steps)


def test_every_prefix_of_the_events_maps_to_a_prefix_of_the_chunks():
    """The index is a cursor: what a reader got at any moment never changes afterwards."""
    run = advance(
        script_run(
            {"text": "One moment.", "calls": [["t_echo", {"text": "a"}], ["t_pay", {"amount": 5}]]},
            {"text": "Paid."},
        )
    )
    events = recorded(run)
    full = chunks_of(run.id, events)
    fold = UIChunks(str(run.id), lambda tool: ())
    seen: list[dict] = []
    for k, (seq, etype, data) in enumerate(events, start=1):
        seen += fold.feed(seq, etype, data)
        assert seen == full[: len(seen)]
        assert chunks_of(run.id, events[:k]) == seen
    assert seen == full


def test_a_failed_tool_and_a_failed_run():
    run = advance(script_run({"text": "Trying.", "calls": [["t_explode", {}]]}))
    assert run.status == "failed"
    out = chunks(run)
    msg = message(out)
    (part,) = msg.tools()
    assert part["state"] == "output-error" and "card declined" in part["errorText"]
    assert [c["type"] for c in out[-2:]] == ["error", "finish"]
    assert out[-1]["finishReason"] == "error" and msg.errors == [run.error]


def test_a_call_refused_before_it_ran_is_an_input_error():
    run = advance(
        script_run({"text": "Hm.", "calls": [["no_such_tool", {"x": 1}]]}, {"text": "ok"})
    )
    msg = message(chunks(run))
    (part,) = msg.tools()
    assert part["type"] == "tool-no_such_tool" and part["state"] == "output-error"


def test_redacted_fields_never_reach_the_chunks(seeded):
    run = start_run("refund", {"order_id": "ORD-1001", "message": "refund"}, enqueue_task=False)
    run = advance(run.run)
    assert run.status == "waiting"  # the product default: every refund needs approval
    lookup = message(chunks(run)).tools()[0]
    assert lookup["type"] == "tool-lookup_order"
    assert lookup["output"]["customer_email"] == MASK
    assert "@" not in str(chunks(run))


# ------------------------------------------------------------------ approvals
def test_parked_approved_and_continued(approver):
    run = advance(
        script_run(
            {"text": "Paying.", "calls": [["t_pay", {"amount": 500}]]}, {"text": "Paid 500."}
        )
    )
    assert run.status == "waiting"
    parked = chunks(run)
    approval = Approval.objects.get(run=run)
    assert [c["type"] for c in parked[-4:]] == [
        "tool-input-available",
        "tool-approval-request",
        "finish-step",
        "finish",
    ]
    assert parked[-3]["approvalId"] == str(approval.id)
    assert parked[-1]["finishReason"] == "tool-calls"

    approval_services.approve(approval.id, user=approver, reason="fine")
    run = advance(run)
    assert run.status == "succeeded"
    out = chunks(run)
    assert out[: len(parked)] == parked  # the continuation only appends
    fold = UIChunks(str(run.id), lambda tool: ())
    for event in recorded(run):
        fold.feed(*event)
    continuation = out[fold.continuation_index(approval.id) :]
    assert [c["type"] for c in continuation[:3]] == [
        "start",
        "tool-approval-response",
        "tool-output-available",
    ]
    assert continuation[1]["approved"] is True and "approver" in continuation[1]["reason"]
    msg = message(out)
    (pay,) = msg.tools()
    assert pay["state"] == "output-available" and pay["output"] == {"paid": 500}
    assert msg.texts[-1] == run.output and msg.finish_reasons == ["tool-calls", "stop"]
    assert {c.get("messageId") for c in out if c["type"] == "start"} == {message_id(run.id)}


def test_a_new_version_of_the_proposal_asks_the_chat_again(approver, lead, monkeypatch):
    """Two approvers: the first one's approval makes a new version, and the chat is asked again
    with it under the approvalId `<id>.2`; the final answer and the output follow that id."""
    from agentruns.registry import get_tool

    monkeypatch.setattr(get_tool("t_pay"), "approvals_required", 2)
    run = advance(
        script_run({"text": "Paying.", "calls": [["t_pay", {"amount": 500}]]}, {"text": "Paid."})
    )
    approval = Approval.objects.get(run=run)
    parked = chunks(run)
    approval_services.approve(approval.id, user=approver, version=1)
    reasked = chunks(run)
    assert reasked[: len(parked)] == parked  # only appended
    assert [c["type"] for c in reasked[len(parked) :]] == [
        "start",
        "tool-input-available",
        "tool-approval-request",
        "finish",
    ]
    assert reasked[-2]["approvalId"] == f"{approval.id}.2"
    assert reasked[-3]["input"] == {"amount": 500}
    fold = UIChunks(str(run.id), lambda tool: ())
    for event in recorded(run):
        fold.feed(*event)
    # a chat that answered the first request is sent everything from the re-ask on
    assert fold.continuation_of_request(str(approval.id)) == len(parked)
    asked = message(reasked).tools()[0]
    assert asked["state"] == "approval-requested" and asked["approval"]["id"] == f"{approval.id}.2"

    approval_services.approve(approval.id, user=lead, version=2)
    done = chunks(advance(run))
    final = message(done)
    assert [p["state"] for p in final.tools()] == ["output-available"]
    response = next(c for c in done if c["type"] == "tool-approval-response")
    assert response["approvalId"] == f"{approval.id}.2" and response["approved"]


def test_rejected_in_the_inbox_is_a_denial(approver):
    run = advance(
        script_run(
            {"text": "Paying.", "calls": [["t_pay", {"amount": 500}]]}, {"text": "Not paid."}
        )
    )
    approval = Approval.objects.get(run=run)
    approval_services.reject(approval.id, user=approver, reason="too much")
    run = advance(run)
    out = chunks(run)
    response = next(c for c in out if c["type"] == "tool-approval-response")
    assert response["approved"] is False and "too much" in response["reason"]
    (pay,) = message(out).tools()
    assert pay["state"] == "output-denied"


def test_cancelled_while_waiting_withdraws_the_call():
    from agentruns.services import cancel_run

    run = advance(script_run({"text": "Paying.", "calls": [["t_pay", {"amount": 500}]]}))
    cancel_run(run.id, reason="customer withdrew")
    out = chunks(run)
    msg = message(out)
    (pay,) = msg.tools()
    assert pay["state"] == "output-error" and "withdrawn" in pay["errorText"]
    assert msg.finish_reasons == ["tool-calls", "other"]


# ------------------------------------------------------------------ superseded model attempts
RUN_ID = "00000000-0000-0000-0000-000000000016"


def sequence(*specs: tuple[str, dict]) -> list[tuple[int, str, dict]]:
    return [(seq, etype, data) for seq, (etype, data) in enumerate(specs, start=1)]


def model_step(event: str, step: int, attempts: int, **extra) -> tuple[str, dict]:
    return (
        event,
        {
            "step": step,
            "id": f"m{step}",
            "kind": "model",
            "tool": "",
            "attempts": attempts,
            **extra,
        },
    )


def delta(step: int, attempt: int, text: str) -> tuple[str, dict]:
    return ("model.delta", {"step": step, "attempt": attempt, "text": text})


CRASHED_MID_STREAM = sequence(
    ("run.created", {"agent": "script", "status": "queued"}),
    ("run.status", {"status": "running"}),
    model_step("step.started", 0, 1),
    delta(0, 1, "Hello wor"),
    delta(0, 1, "ld, I am"),
    # the worker was SIGKILLed here; the next one recovers the step
    ("run.status", {"status": "running"}),
    ("model.superseded", {"step": 0, "attempt": 1}),
    model_step("step.started", 0, 2),
    delta(0, 2, "Hello world, "),
    delta(0, 2, "I am back."),
    model_step("step.succeeded", 0, 2),
    ("run.output", {"text": "Hello world, I am back."}),
    ("run.status", {"status": "succeeded"}),
)


def test_a_superseded_attempt_is_reset_not_left_half_written():
    out = chunks_of(RUN_ID, CRASHED_MID_STREAM)
    types = [c["type"] for c in out]
    assert types == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "reset-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    assert out[2]["id"] != out[6]["id"]
    msg = message(out)
    assert msg.texts == ["Hello world, I am back."]
    # a reader that arrived after the crash gets the very same chunks
    late = chunks_of(RUN_ID, CRASHED_MID_STREAM)
    assert late == out


def test_a_newer_attempt_streaming_voids_the_older_one_even_without_its_event():
    events = [e for e in CRASHED_MID_STREAM if e[1] != "model.superseded"]
    events = [(seq, etype, data) for seq, (_, etype, data) in enumerate(events, start=1)]
    msg = message(chunks_of(RUN_ID, events))
    assert msg.texts == ["Hello world, I am back."]


def test_a_run_that_dies_inside_a_turn_leaves_no_text_part():
    events = sequence(
        *[spec for _, *spec in [(s, t, d) for s, t, d in CRASHED_MID_STREAM[:5]]],
        ("run.status", {"status": "failed", "error": "internal error"}),
    )
    out = chunks_of(RUN_ID, events)
    msg = message(out)
    assert msg.texts == [] and msg.errors == ["internal error"]
    assert [c["type"] for c in out[-4:]] == ["reset-step", "finish-step", "error", "finish"]


def test_feeding_out_of_order_is_refused():
    fold = UIChunks(RUN_ID, lambda tool: ())
    fold.feed(*CRASHED_MID_STREAM[0])
    with pytest.raises(ValueError):
        fold.feed(*CRASHED_MID_STREAM[2])


def test_an_unencodable_stored_text_is_sent_repaired_not_raised():
    """SQLite can store a lone surrogate; the chunk is still sent, with U+FFFD in its place."""
    frame = encode_chunk({"type": "text-delta", "id": "t0", "delta": "broken \ud800 text"})
    assert "broken \ufffd text" in frame.encode("utf-8").decode("utf-8")
