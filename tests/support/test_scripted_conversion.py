"""The scripted model converts a run's conversation to the engine's form once per message: a
run's model requests carry its whole history again each time, so converting it afresh made
every request cost the run's length (runtime/providers/scripted_model.py, `Playing.converted`)."""

from __future__ import annotations

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from agentruns.runtime.providers import scripted_model
from agentruns.runtime.providers.scripted_model import Playing, engine_messages


def conversation(turns: int) -> list:
    messages: list = [ModelRequest(parts=[UserPromptPart("refund ORD-1001 please")])]
    for n in range(turns):
        call = f"call_{n}"
        messages.append(ModelResponse(parts=[ToolCallPart("lookup_order", {"n": n}, call)]))
        messages.append(ModelRequest(parts=[ToolReturnPart("lookup_order", {"n": n}, call)]))
    messages.append(ModelResponse(parts=[TextPart("Done.")]))
    return messages


def recorded(call_id: str) -> str:
    return f'{{"recorded": "{call_id}"}}'


def test_a_growing_conversation_converts_only_its_new_messages(monkeypatch):
    counted: list[str] = []
    estimate = scripted_model.estimate_tokens
    monkeypatch.setattr(
        scripted_model, "estimate_tokens", lambda text: counted.append(text) or estimate(text)
    )
    whole = conversation(3)
    playing = Playing(policy=None, instructions="Be brief.", tool_content=recorded)

    first = engine_messages(whole[:3], playing)
    converted_first = len(counted)
    again = engine_messages(whole, playing)  # the same objects, five more messages
    # only the five new messages were converted (one estimate each)
    assert len(counted) - converted_first == 5
    assert again[: len(first)] == first
    # the same as converting it afresh, recorded tool contents included
    assert again == engine_messages(
        whole, Playing(policy=None, instructions="Be brief.", tool_content=recorded)
    )
    assert again[3] == {"role": "tool", "tool_call_id": "call_0", "content": recorded("call_0")}


def test_a_conversation_of_other_messages_is_converted_afresh():
    playing = Playing(policy=None, tool_content=recorded)
    engine_messages(conversation(2), playing)
    other = conversation(1)  # equal messages, other objects: nothing of the first is reused
    assert engine_messages(other, playing) == engine_messages(
        other, Playing(policy=None, tool_content=recorded)
    )
    assert playing.converted.sources == other
    assert all(a is b for a, b in zip(playing.converted.sources, other, strict=True))
