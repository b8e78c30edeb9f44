"""POST /api/chat/<agent> and its resume URL: auth, permissions and refusals (no streaming here;
tests/stream/test_ai_sdk_client.py reads the streams with the real AI SDK client)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentruns.api.chat import chat_dedupe_key
from agentruns.models import Run
from agentruns.services import start_run
from tests.conftest import ApiClient, make_user
from tests.helpers import advance

pytestmark = pytest.mark.django_db

CHATTER = [
    "agentruns.view_run",
    "agentruns.start_run",
    "approvals.view_approval",
    "approvals.decide_approval",
]


def chat_body(chat_id: str = "c1", text: str = "refund please", **extra) -> dict:
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "messages": [message], "trigger": "submit-message", **extra}


def answered(approval_id: object, approved: object = True) -> dict:
    part = {
        "type": "tool-t_pay",
        "toolCallId": "x",
        "state": "approval-responded",
        "approval": {"id": approval_id, "approved": approved},
    }
    return {"id": "a1", "role": "assistant", "parts": [{"type": "step-start"}, part]}


@pytest.fixture
def chatter(django_user_model):
    return ApiClient(make_user(django_user_model, "chatter", CHATTER))


def test_a_session_post_needs_the_csrf_token(django_user_model):
    looker = make_user(django_user_model, "looker", ["agentruns.view_run"])
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(looker)  # (Client.login cannot pass the request django-axes needs)
    body = json.dumps(chat_body())
    refused = browser.post("/api/chat/refund", body, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    browser.get("/examples/chat/")  # a page with a form sets the cookie
    token = browser.cookies["csrftoken"].value
    passed = browser.post(
        "/api/chat/refund", body, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    # past the CSRF check, refused for the missing permission to start a run
    assert passed.status_code == 403 and "agentruns.start_run" in passed.json()["error"]
    assert not Run.objects.exists()


def test_watching_needs_view_run(django_user_model):
    nobody = ApiClient(make_user(django_user_model, "nobody"))
    assert nobody.get("/api/chat/refund/c1/stream").status_code == 403
    assert nobody.post("/api/chat/refund", chat_body()).status_code == 403


def test_resume_without_a_run_is_204(chatter):
    response = chatter.get("/api/chat/refund/no-such-chat/stream?startIndex=3")
    assert response.status_code == 204 and response.content == b""


@pytest.mark.parametrize(
    "body, error",
    [
        ({"id": "c", "messages": "hi"}, "'messages' must be a list"),
        ({"id": "c", "messages": [{"role": "user", "parts": [{"text": "x"}]}]}, "type"),
        ({"id": "c", "messages": [{"role": "robot", "parts": []}]}, "role"),
        ({"id": "..", "messages": []}, "'id'"),
        (chat_body(trigger="resume-stream"), "'trigger' must be one of"),
        (chat_body(input=[1]), "'input' must be a JSON object"),
        (chat_body(text="x" * 5001), "longer than 5000"),
    ],
)
def test_bad_requests_are_400s_naming_the_problem(chatter, body, error):
    response = chatter.post("/api/chat/refund", body)
    assert response.status_code == 400, response.content
    assert error in response.json()["error"]
    assert not Run.objects.exists()


def test_extra_fields_of_front_ends_are_ignored_but_unknown_agents_are_404(chatter):
    response = chatter.post("/api/chat/nope", chat_body(metadata={"x": 1}))
    assert response.status_code == 404 and "unknown agent" in response.json()["error"]


def parked_chat(user, chat_id: str = "c1") -> Run:
    """A chat's run (of `user`), parked on an approval of t_pay."""
    run = start_run(
        "script",
        {"script": [{"text": "pay", "calls": [["t_pay", {"amount": 500}]]}], "message": "go"},
        dedupe_key=chat_dedupe_key(chat_id, user),
        user=user,
        enqueue_task=False,
    ).run
    assert advance(run).status == "waiting"
    return run


@pytest.mark.parametrize(
    "approval_id, approved, status, error",
    [
        ("abc", True, 400, "is not one of this app's"),
        ("1", "yes", 400, "approval.approved must be true or false"),
        ("999999", True, 404, "not part of this chat's run"),
        # digits to Python, not ids: one ASCII-only parser (it answered an HTML 500)
        ("²", True, 400, "is not one of this app's"),
        ("١٤", True, 400, "is not one of this app's"),
        ("1.²", True, 400, "is not one of this app's"),
        (14, True, 400, "is not one of this app's"),
    ],
)
def test_bad_approval_answers(chatter, approval_id, approved, status, error):
    run = parked_chat(chatter.user)
    body = chat_body()
    body["messages"].append(answered(approval_id, approved))
    response = chatter.post("/api/chat/script", body)
    assert response.status_code == status, response.content
    assert error in response.json()["error"]
    assert run.approvals.get().status == "pending"


def test_many_answers_for_one_item_collapse_and_too_many_items_are_a_400(chatter):
    run = parked_chat(chatter.user)
    approval = run.approvals.get()
    body = chat_body()
    body["messages"].append(answered(str(approval.id)))
    parts = body["messages"][-1]["parts"]
    parts[1:] = parts[1:] * 999  # the same answer 999 times: one decision
    response = chatter.post("/api/chat/script", body)
    assert response.status_code == 200, response.content
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decisions.count() == 1

    other = parked_chat(chatter.user, "c2").approvals.get()
    body = chat_body("c2")
    body["messages"].append(answered(str(other.id)))
    body["messages"][-1]["parts"].append(answered(str(other.id), False)["parts"][1])
    contradicting = chatter.post("/api/chat/script", body)
    assert contradicting.status_code == 400
    assert "a second, different answer" in contradicting.json()["error"]

    body = chat_body("c2")
    body["messages"].append(answered(str(other.id)))
    body["messages"][-1]["parts"] = [
        {**answered(str(n))["parts"][1], "toolCallId": f"x{n}"} for n in range(1, 22)
    ]
    capped = chatter.post("/api/chat/script", body)
    assert capped.status_code == 400 and "at most 20 approvals" in capped.json()["error"]
    other.refresh_from_db()
    assert other.status == "pending" and other.decisions.count() == 0


def test_a_chat_id_is_its_users_own_and_not_an_api_idempotency_key(chatter, django_user_model):
    # an API run started with the key "chat:T-1030" is never the run of chat T-1030
    api_start = chatter.post(
        "/api/runs",
        {"agent": "script", "input": {"script": [{"text": "hi"}]}},
        HTTP_IDEMPOTENCY_KEY="chat:T-1030",
    )
    assert api_start.status_code == 400 and "may not begin with" in api_start.json()["error"]
    assert not Run.objects.exists()
    # another user's chat of the same id is not streamed to me
    mine = parked_chat(chatter.user, "T-1030")
    other = ApiClient(make_user(django_user_model, "other", CHATTER))
    assert other.get("/api/chat/script/T-1030/stream").status_code == 204
    body = chat_body("T-1030")
    body["messages"].append(answered(str(mine.approvals.get().id)))
    refused = other.post("/api/chat/script", body)
    assert refused.status_code == 404 and "no run" in refused.json()["error"]
    assert mine.approvals.get().status == "pending"
    assert chatter.get("/api/chat/script/T-1030/stream").status_code == 200


def test_an_answer_in_a_chat_without_a_run_is_404(chatter):
    body = chat_body()
    body["messages"].append(answered("1"))
    response = chatter.post("/api/chat/script", body)
    assert response.status_code == 404 and "no run" in response.json()["error"]


def test_the_endpoints_are_in_the_openapi_document(api):
    paths = api.get("/api/openapi.json").json()["paths"]
    assert "post" in paths["/api/chat/{agent}"]
    assert "startIndex" in json.dumps(paths["/api/chat/{agent}/{chat_id}/stream"])


def test_a_traceparent_on_the_chat_request_continues_the_callers_trace(chatter):
    trace = "0af7651916cd43dd8448eb211c80319c"
    response = chatter.post(
        "/api/chat/script",
        chat_body(chat_id="traced", input={"script": [{"text": "hello"}]}),
        HTTP_TRACEPARENT=f"00-{trace}-b7ad6b7169203331-01",
    )
    assert response.status_code == 200
    run = Run.objects.get(id=response["x-run-id"])
    assert run.trace_id == trace and run.trace_parent == f"00-{trace}-b7ad6b7169203331-01"
    response.close()
