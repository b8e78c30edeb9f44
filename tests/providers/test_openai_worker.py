"""The refund agent over the OpenAI provider with real processes: daphne (API + refund gateway),
a real `qcluster` worker using the official SDK against the fake server's socket, PostgreSQL.
Assertions are on the outside world: the gateway ledger, the requests the model server got."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from agentruns.models import AttemptOutcome, OperationExecution, RunEvent, Step, StepAttempt
from agentruns.tokens import create_token
from scripts.fake_openai_server import FakeOpenAI
from support.models import GatewayRefund, Order
from tests.helpers import steps
from tests.procs import gateway_refunds, start_run_over_http, start_web, start_worker, wait_finished
from tests.providers.kit import API_KEY, MODEL

pytestmark = pytest.mark.django_db(transaction=True)


def model_env(fake: FakeOpenAI, **extra: object) -> dict[str, object]:
    return {
        "AGENTRUNS_MODEL": MODEL,
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_TIMEOUT_SECONDS": 20,
        "REFUND_APPROVAL_THRESHOLD_CENTS": 1_000_000_000,  # no approvals: straight through
        **extra,
    }


def test_refund_run_end_to_end_over_the_openai_provider(tmp_path: Path, seeded):
    with FakeOpenAI(mode="refund", delay=0.005, api_key=API_KEY) as fake:
        env = model_env(fake)
        web, url = start_web(tmp_path, **env)
        # DEBUG logging everywhere: the key must still never reach the log
        worker = start_worker(
            tmp_path, REFUND_GATEWAY_URL=url + "/gateway", LOG_LEVEL="DEBUG", **env
        )
        try:
            token = create_token(User.objects.get(username="lead"))  # seed_demo's lead
            run_id = start_run_over_http(
                url,
                token,
                {
                    "order_id": "ORD-1001",
                    "message": "The blender arrived broken, please refund $40",
                },
            )
            run = wait_finished(run_id, worker)
            ledger = gateway_refunds(url, "ORD-1001")  # what the gateway says it executed
        finally:
            worker.stop()
            web.stop()

        assert run.status == "succeeded", run.error
        assert run.model == MODEL
        assert run.output == "Done: refunded 40.00 USD for order ORD-1001 and told the customer."

        # the outside world: exactly one refund, of the amount the customer asked for
        assert [(r["amount_cents"], r["order_id"]) for r in ledger] == [(4000, "ORD-1001")]
        (refund,) = GatewayRefund.objects.filter(order_id="ORD-1001")
        tools = list(
            Step.objects.filter(run=run, kind="tool")
            .order_by("index")
            .values_list("tool", "status")
        )
        assert tools == [
            ("lookup_order", "succeeded"),
            ("issue_refund", "succeeded"),
            ("add_ticket_note", "succeeded"),
            ("send_customer_reply", "succeeded"),
        ]
        assert (
            refund.idempotency_key == Step.objects.get(run=run, tool="issue_refund").idempotency_key
        )

        # the model server saw four streamed turns, authenticated, with the tools declared
        requests = fake.chat_requests()
        assert len(requests) == 4
        assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in requests)
        assert all(r.body["model"] == "fake-model" and r.body["stream"] for r in requests)
        assert {t["function"]["name"] for t in requests[0].body["tools"]} == {
            "lookup_order",
            "issue_refund",
            "hand_over",
            "add_ticket_note",
            "send_customer_reply",
        }
        # a redacted field (customer_email) is hidden from people but sent to the model in full
        email = Order.objects.get(order_id="ORD-1001").customer_email
        lookup_result = json.loads(requests[1].body["messages"][-1]["content"])
        assert lookup_result["customer_email"] == email

        # usage summed on the run, text streamed into events
        assert run.prompt_tokens > 0 and run.completion_tokens > 0
        assert run.prompt_tokens == sum(s.prompt_tokens for s in steps(run, kind="model"))
        assert RunEvent.objects.filter(run=run, type="model.delta").count() >= 4
        assert API_KEY not in (tmp_path / "worker.log").read_text(errors="replace")


VOLATILE_KEYS = {"refund_id", "note_id", "outbox_id"}  # row ids that differ between two runs


def normalized(body: dict) -> dict:
    """A request body with the ids of rows this run created replaced by placeholders."""
    body = copy.deepcopy(body)
    for message in body["messages"]:
        if message["role"] == "tool":
            content = json.loads(message["content"])
            for key in VOLATILE_KEYS & set(content):
                content[key] = "<id>"
            message["content"] = json.dumps(content, sort_keys=True)
    return json.loads(re.sub(r"rf_\d+", "rf_<id>", json.dumps(body)))


def test_crash_mid_stream_resumes_with_a_new_attempt_and_the_same_conversation(
    tmp_path: Path, seeded
):
    """Every model step of the second run is killed (SIGKILL by failpoint) after a delta batch
    was persisted; each is re-requested as attempt 2 with exactly the request an uninterrupted
    run sends, the dead attempt's text is superseded, and the output has the text once."""
    run_input = {"order_id": "ORD-1002", "message": "Wrong size, I would like my money back."}
    with FakeOpenAI(mode="refund", delay=0.03, api_key=API_KEY) as fake:
        env = model_env(fake)
        web, url = start_web(tmp_path, **env)
        try:
            token = create_token(User.objects.get(username="lead"))  # seed_demo's lead

            clean_worker = start_worker(
                tmp_path, "clean-worker", REFUND_GATEWAY_URL=url + "/gateway", **env
            )
            try:
                clean = wait_finished(start_run_over_http(url, token, run_input), clean_worker)
            finally:
                clean_worker.stop()
            clean_bodies = [r.body for r in fake.chat_requests()]
            fake.clear()
            # the second run meets the order as the first did: its refund and its operation key
            # (one refund per request, the order's open ticket, across runs) are set aside, so
            # both runs ask the same
            clean_refund_keys = list(
                GatewayRefund.objects.filter(order_id="ORD-1002").values_list(
                    "idempotency_key", flat=True
                )
            )
            GatewayRefund.objects.filter(order_id="ORD-1002").delete()
            OperationExecution.objects.filter(key="refund:T-1002").delete()  # its request

            crashing_worker = start_worker(
                tmp_path,
                "crashing-worker",
                REFUND_GATEWAY_URL=url + "/gateway",
                AGENTRUNS_FAILPOINTS="model_streaming=crash_once",
                AGENTRUNS_FAILPOINT_DIR=tmp_path / "failpoints",
                AGENTRUNS_DELTA_FLUSH_MS=10,  # a batch is persisted before the turn ends
                **env,
            )
            try:
                resumed = wait_finished(
                    start_run_over_http(url, token, run_input), crashing_worker, timeout=240
                )
            finally:
                crashing_worker.stop()
        finally:
            web.stop()
        resumed_bodies = [r.body for r in fake.chat_requests()]

    assert clean.status == "succeeded", clean.error
    assert resumed.status == "succeeded", resumed.error
    model_steps = steps(resumed, kind="model")
    assert len(model_steps) == 4

    # every model step died once mid-stream and was re-requested as a second attempt
    for step in model_steps:
        assert step.attempts == 2
        outcomes = list(
            StepAttempt.objects.filter(step=step)
            .order_by("number")
            .values_list("outcome", flat=True)
        )
        assert outcomes == [AttemptOutcome.CRASHED, AttemptOutcome.SUCCEEDED]
        dead = RunEvent.objects.filter(
            run=resumed, type="model.delta", data__step=step.index, data__attempt=1
        )
        assert dead.exists()  # the crash came after text had been persisted
        superseded = RunEvent.objects.get(
            run=resumed, type="model.superseded", data__step=step.index
        )
        assert superseded.data["attempt"] == 1
        live = RunEvent.objects.filter(
            run=resumed, type="model.delta", data__step=step.index, data__attempt=2
        )
        assert "".join(e.data["text"] for e in live.order_by("seq")) == step.text

    # the final output contains the text once, and is what the uninterrupted run said
    assert resumed.output == clean.output == model_steps[-1].text
    assert resumed.output.count("Done: refunded") == 1

    # one refund per run, with that run's key: the crashes never repeated a side effect
    refunds = list(GatewayRefund.objects.filter(order_id="ORD-1002"))
    keys = {Step.objects.get(run=r, tool="issue_refund").idempotency_key for r in (clean, resumed)}
    assert sorted([*clean_refund_keys, *(r.idempotency_key for r in refunds)]) == sorted(keys)

    # the model server got each request twice (dead attempt, new attempt), byte-for-byte equal,
    # and the resumed conversation is the uninterrupted one's (row ids aside)
    assert len(resumed_bodies) == 8
    assert all(resumed_bodies[i] == resumed_bodies[i + 1] for i in range(0, 8, 2))
    assert [normalized(b) for b in resumed_bodies[::2]] == [normalized(b) for b in clean_bodies]
