"""A question answered in the chat (issue 33, item 2): the run's `ask_human` call shows in the UI
message stream as a tool part awaiting its output; the chat's `addToolOutput` (the next POST
ends with the assistant message, the part `output-available`) answers it through the inbox's one
decision, with the same rights and checks; the stream continues after the stop and the model
reads the answer. In-process against PostgreSQL (the stream's chunks from the fold)."""

from __future__ import annotations

import pytest

from agentruns.models import Run, RunEvent, RunStatus
from agentruns.stream.ui_stream import new_fold
from approvals.models import Approval
from tests.api.test_chat import CHATTER
from tests.approvals import question_agent
from tests.conftest import ApiClient, make_user
from tests.helpers import advance
from tests.pydantic_ai.kit import plan

pytestmark = pytest.mark.django_db

QUESTION = "Is this order eligible?"


def chunks(run: Run) -> list[dict]:
    fold, out = new_fold(run), []
    for event in RunEvent.objects.filter(run=run).order_by("seq"):
        out += fold.feed(event.seq, event.type, event.data)
    return out


def user_message(text: str) -> dict:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def with_output(call_id: str, output: object) -> dict:
    """The assistant message as the AI SDK sends it after `addToolOutput`."""
    part = {
        "type": "tool-ask_human",
        "toolCallId": call_id,
        "state": "output-available",
        "input": {"question": QUESTION},
        "output": output,
    }
    return {"id": "a1", "role": "assistant", "parts": [{"type": "step-start"}, part]}


def asked_in_chat(api: ApiClient, choices: list[str] | None = None) -> tuple[Run, str]:
    args = {"question": QUESTION, **({"choices": choices} if choices else {})}
    text = plan(("ask_human", args), say="Colleague said:")
    started = api.post("/api/chat/pa-asker", {"id": "c1", "messages": [user_message(text)]})
    assert started.status_code == 200, started.content
    run = advance(Run.objects.get(id=started["x-run-id"]))
    assert run.status == RunStatus.WAITING, run.error
    return run, text


def test_the_question_awaits_its_output_in_the_chat_and_add_tool_output_answers_it(
    django_user_model,
):
    question_agent.SEEN.clear()
    api = ApiClient(make_user(django_user_model, "chatter", CHATTER))
    run, text = asked_in_chat(api)
    shown = chunks(run)
    call = next(c for c in shown if c["type"] == "tool-input-available")
    assert (call["toolName"], call["input"]) == ("ask_human", {"question": QUESTION})
    assert not [c for c in shown if c.get("toolCallId") == call["toolCallId"] and "output" in c]
    assert shown[-1]["type"] == "finish" and shown[-1]["finishReason"] == "tool-calls"

    body = {"id": "c1", "messages": [user_message(text), with_output(call["toolCallId"], "Yes")]}
    answered = api.post("/api/chat/pa-asker", body)
    assert answered.status_code == 200, answered.content
    item = Approval.objects.get(run=run)
    assert (item.status, item.answer, item.decided_by.username) == ("resolved", "Yes", "chatter")
    # the continuation goes on at once (a stream whose last chunk is a finish would end there)
    now = chunks(run)
    assert [c["type"] for c in now[len(shown) :]] == ["start", "tool-output-available"]
    assert (now[-1]["toolCallId"], now[-1]["output"]) == (call["toolCallId"], "Yes")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert question_agent.SEEN == [("ask_human", "Yes")]
    after = chunks(run)
    outputs = [c for c in after if c.get("toolCallId") == call["toolCallId"] and "output" in c]
    assert [c["output"] for c in outputs] == ["Yes"]  # once, though its step succeeds later
    assert after[-1]["type"] == "finish" and after[-1]["messageMetadata"]["status"] == "succeeded"


def test_the_chat_answer_keeps_the_rules_of_the_inbox(django_user_model):
    api = ApiClient(make_user(django_user_model, "chatter", CHATTER))
    run, text = asked_in_chat(api, choices=["yes", "no"])
    call_id = next(c for c in chunks(run) if c["type"] == "tool-input-available")["toolCallId"]

    def post(output: object, client: ApiClient = api):
        return client.post(
            "/api/chat/pa-asker",
            {"id": "c1", "messages": [user_message(text), with_output(call_id, output)]},
        )

    assert post({"not": "text"}).status_code == 400
    assert Approval.objects.get(run=run).status == "pending"
    # free text is an answer too (DESIGN 6: the choices are offered as buttons)
    assert post({"answer": "only if it is under 30 days"}).status_code == 200
    assert Approval.objects.get(run=run).answer == "only if it is under 30 days"
    assert post("yes").status_code == 200  # answered first: left as it is, the stream shows it
    assert Approval.objects.get(run=run).answer == "only if it is under 30 days"


def test_answering_in_the_chat_needs_the_right_to_decide(django_user_model):
    starter = ApiClient(make_user(django_user_model, "starter", CHATTER[:2]))
    run, text = asked_in_chat(starter)
    call_id = next(c for c in chunks(run) if c["type"] == "tool-input-available")["toolCallId"]
    body = {"id": "c1", "messages": [user_message(text), with_output(call_id, "yes")]}
    refused = starter.post("/api/chat/pa-asker", body)
    assert refused.status_code == 403 and "approvals.decide_approval" in refused.json()["error"]
    assert Approval.objects.get(run=run).status == "pending"
