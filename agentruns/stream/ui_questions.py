"""Questions answered in the chat: a run that asked a person (`ask_human`) shows the call in the
chat as a tool part awaiting its output (`tool-input-available`, no output; the stream's
segment ends with `tool-calls`), which an AI SDK front end answers with `addToolOutput`. Its
next POST ends with that assistant message; each tool part in state `output-available` whose
call is one of the run's questions is answered through the inbox's one decision (the runtime's
inbox port: the same rules as the inbox and the API; the chat endpoint, api/chat.py, calls it),
and the stream continues after the stop that asked. A question somebody answered first is left as it is: the continuation shows the
answer that counted.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import HttpRequest

from agentruns.models import Run
from agentruns.runtime.inbox import Refused, inbox
from agentruns.stream.ui_stream import chunks_until_now

MAX_ANSWER_CHARS = 4000


def tool_outputs(messages: list[dict]) -> dict[str, Any]:
    """The outputs of the tool parts of the request's last message, when it is the assistant's
    (a front end's `addToolOutput`, sent on): {toolCallId: output}."""
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "assistant":
        return {}
    outputs: dict[str, Any] = {}
    for part in last["parts"]:
        kind = str(part.get("type", ""))
        if not (kind.startswith("tool-") or kind == "dynamic-tool"):
            continue
        call_id = part.get("toolCallId")
        if part.get("state") == "output-available" and isinstance(call_id, str):
            outputs[call_id] = part.get("output")
    return outputs


def answer_text(call_id: str, output: Any) -> str:
    text = output.get("answer") if isinstance(output, dict) else output
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        raise Refused(
            f"the output of tool call {call_id!r} answers a question: a string of at most "
            f"{MAX_ANSWER_CHARS} characters",
            400,
        )
    return text


def asked_in(run: Run, outputs: dict[str, Any]) -> dict[str, Any]:
    """The outputs that answer one of the run's questions (others are the stream's own)."""
    asked = inbox().question_calls(run, list(outputs))
    return {call_id: outputs[call_id] for call_id in outputs if call_id in asked}


def answer(request: HttpRequest, run: Run, outputs: dict[str, Any]) -> int:
    """Answer the run's questions with the chat's outputs, all or none; returns the chunk index
    the continuation starts at. Refused (the inbox's status: 400/403/404) for a bad answer."""
    items: list[int] = []
    with transaction.atomic():
        for call_id, output in outputs.items():
            text = answer_text(call_id, output)
            items.append(inbox().answer_question(run, call_id, user=request.user, answer=text))
    fold = chunks_until_now(run)
    starts = [index for item in items if (index := fold.continuation_index(item)) is not None]
    return max(starts) if starts else fold.count
