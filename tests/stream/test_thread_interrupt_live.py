"""A three-turn thread with an interrupt, with real processes (issue 33): daphne serving the
threads API, a `qcluster` worker on PostgreSQL whose model is the fake OpenAI server's real
socket. The second turn looks the order up (a tool step that completes) and is streaming its
answer when the customer's third message interrupts it: the second run is cancelled within a
second, and the third turn's request to the model server carries the whole conversation: the
first answer, the lookup and its answer, the text streamed before the interrupt, and the new
message. The fake server answers 400 to a conversation with an unanswered tool call, as the real
API does, so the history handed on is also a valid one.
"""

from __future__ import annotations

import time

import httpx
import pytest

from agentruns.models import Run, RunEvent, StepStatus
from agentruns.tokens import create_token
from scripts.fake_openai_server import FakeOpenAI, Reply
from tests.conftest import make_user
from tests.procs import wait_until
from tests.providers.kit import API_KEY
from tests.stream.kit import served_by_fake_openai

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(300)]

THREAD = "live-interrupt"
LONG = "word " * 400


def post(client: httpx.Client, text: str, **body: object) -> Run:
    response = client.post(f"/api/threads/{THREAD}/messages", json={"text": text, **body})
    assert response.status_code == 202, response.text
    return Run.objects.get(id=response.json()["run_id"])


def ended(run: Run, timeout: float = 60) -> Run:
    return wait_until(
        lambda: (
            Run.objects.filter(id=run.id, status__in=("succeeded", "failed", "cancelled"))
            .only("id", "status", "output")
            .first()
        ),
        timeout=timeout,
        interval=0.02,
        message=f"run {run.id} to end",
    )


def test_three_turns_with_an_interrupt_mid_stream(tmp_path, django_user_model):
    customer = make_user(
        django_user_model, "customer", ["agentruns.view_run", "agentruns.start_run"]
    )
    headers = {"Authorization": f"Bearer {create_token(customer)}"}
    with (
        FakeOpenAI(mode="error", api_key=API_KEY) as fake,
        served_by_fake_openai(tmp_path, fake.url) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as client,
    ):
        fake.script(Reply(text="Hello, how can I help?"))
        first = post(client, "Hello", agent="script")
        assert ended(first).status == "succeeded"

        fake.script(
            Reply(tool_calls=[("t_echo", {"text": "ORD-7"})]),
            Reply(text=LONG, chunk_chars=4, delay=0.02),
        )
        second = post(client, "Where is order ORD-7?")
        wait_until(  # looked up, and streaming its answer
            lambda: RunEvent.objects.filter(run_id=second.id, type="model.delta").count() >= 5,
            timeout=60,
            interval=0.02,
            message="the second turn's answer streaming",
        )
        fake.script(Reply(text="Understood, nothing more on ORD-7."))
        asked = time.monotonic()
        third = post(client, "Never mind, thanks", multitask="interrupt")
        assert ended(second, timeout=10).status == "cancelled"
        to_cancelled = time.monotonic() - asked
        assert ended(third).status == "succeeded"
        body = client.get(f"/api/threads/{THREAD}").json()

    print(f"interrupt -> the streaming run's cancelled row {to_cancelled * 1000:.0f} ms")
    assert to_cancelled < 1.0
    assert [r["status"] for r in body["runs"]] == ["succeeded", "cancelled", "succeeded"]
    second.refresh_from_db()
    lookup = second.steps.get(kind="tool")
    assert (lookup.tool, lookup.status) == ("t_echo", StepStatus.SUCCEEDED)  # done, and kept
    cut = second.output
    assert cut and len(cut) < len(LONG) and LONG.startswith(cut)

    # the third turn's request to the model server: the whole conversation, in order
    sent = fake.chat_requests()[-1].messages
    said = [
        (m["role"], m.get("content"), [c["function"]["name"] for c in m.get("tool_calls") or []])
        for m in sent
        if m["role"] != "system"
    ]
    roles = [s[0] for s in said]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "user"]
    assert "Hello" in said[0][1] and said[1][1] == "Hello, how can I help?"
    assert "ORD-7" in said[2][1] and said[3][2] == ["t_echo"]
    assert "ORD-7ORD-7" not in said[4][1] and "ORD-7" in said[4][1]  # the lookup's answer
    assert said[5][1] == cut  # what was said before the interrupt
    assert "Never mind, thanks" in said[6][1]
    assert len(fake.chat_requests()) == 4  # no turn was asked twice
