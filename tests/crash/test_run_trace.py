"""One OpenTelemetry trace per run, end to end, received by a real OTLP/HTTP receiver.

Real daphne and qcluster processes export to the receiver (`tests/otlp_receiver.py`). A refund
run started over the API with a caller's `traceparent` parks for approval, is approved over the
API, then its worker is SIGKILLed in the refund call (failpoint `step_started:issue_refund`) and
a second worker finishes it. The trace has the caller's trace id and the tree of
`agentruns/runtime/tracing.py`; the gateway saw the trace id of the refund's span; no value a
tool declared secret appears anywhere in what was exported, message content capture included.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets

import httpx
import pytest
from django.contrib.auth import get_user_model

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.runtime.tracing.tracecontext import root_span_id, slice_span_id
from agentruns.tokens import create_token
from support.models import GatewayRefund, Order
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.procs import Proc, start_web, start_worker, wait_finished, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash]

ORDER = "ORD-1017"


@pytest.fixture
def receiver():
    received = OtlpReceiver().start()
    yield received
    received.stop()


def otel_env(receiver: OtlpReceiver, service: str) -> dict[str, object]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": 100,  # export within 0.1 s: a SIGKILL loses little
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
        "REFUND_APPROVAL_THRESHOLD_CENTS": 0,  # every refund parks for a person
    }


def worker(tmp_path, procs: list[Proc], base: str, name: str, **env: object) -> Proc:
    proc = start_worker(tmp_path, name=name, REFUND_GATEWAY_URL=base + "/gateway", **env)
    procs.append(proc)
    return proc


def by_name(spans: list[ReceivedSpan], prefix: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def test_a_parked_crashed_resumed_run_is_one_trace(tmp_path, procs, seeded, receiver):
    lead, approver = (get_user_model().objects.get(username=n) for n in ("lead", "approver"))
    web, base = start_web(tmp_path, **otel_env(receiver, "agentruns-web"))
    procs.append(web)
    first = worker(
        tmp_path,
        procs,
        base,
        "worker-1",
        **otel_env(receiver, "agentruns-worker"),
        AGENTRUNS_FAILPOINTS="step_started:issue_refund=crash",
    )
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    response = httpx.post(
        f"{base}/api/runs",
        json={"agent": "refund", "input": {"order_id": ORDER, "message": "It broke, refund."}},
        headers={
            "Authorization": f"Bearer {create_token(lead)}",
            "traceparent": f"00-{caller_trace}-{caller_span}-01",
        },
        timeout=30,
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    run = Run.objects.get(id=run_id)
    assert run.trace_id == caller_trace

    # parked: approve it through the API as the approver
    wait_until(
        lambda: Run.objects.filter(id=run_id, status=RunStatus.WAITING).exists(),
        timeout=60,
        message="the run to park",
    )
    approver_auth = {"Authorization": f"Bearer {create_token(approver)}"}
    pending = httpx.get(
        f"{base}/api/approvals?status=pending", headers=approver_auth, timeout=30
    ).json()["approvals"]
    (approval,) = [a for a in pending if a["run_id"] == run_id]
    decided = httpx.post(
        f"{base}/api/approvals/{approval['id']}",
        json={"decision": "approve", "reason": "ok"},
        headers=approver_auth,
        timeout=30,
    )
    assert decided.status_code == 200, decided.text

    # the first worker dies in the refund call (its running + attempt row is committed)
    wait_until(
        lambda: Step.objects.filter(
            run_id=run_id, tool="issue_refund", status=StepStatus.RUNNING
        ).exists(),
        timeout=60,
        message="the refund call to start",
    )
    first.kill()
    second = worker(tmp_path, procs, base, "worker-2", **otel_env(receiver, "agentruns-worker"))
    finished = wait_finished(run_id, second, timeout=120)
    assert finished.status == RunStatus.SUCCEEDED, finished.error

    # ------------------------------------------------------------ the trace
    root_id = f"{root_span_id(finished.id):016x}"

    def complete(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == caller_trace}
        return "invoke_agent refund" in names and "await_approval issue_refund" in names

    receiver.wait_for(complete, timeout=60)
    second.kill()  # nothing more to come; what it had batched was exported above
    spans = receiver.trace(caller_trace)
    if os.environ.get("TRACE_WATERFALL_JSON"):  # scripts/trace_waterfall.py renders docs/trace.png
        with open(os.environ["TRACE_WATERFALL_JSON"], "w") as out:
            json.dump([dataclasses.asdict(s) for s in spans], out, indent=1)
    assert {s.trace_id for s in spans} == {caller_trace}
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans), "span ids are unique"

    (root,) = by_name(spans, "invoke_agent")
    assert root.name == "invoke_agent refund"
    assert root.span_id == root_id
    assert root.parent_span_id == caller_span, "the run continues the caller's trace"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == run_id
    assert root.attributes["agentruns.run.status"] == "succeeded"
    assert root.start_ns <= min(s.start_ns for s in spans)
    assert root.end_ns >= max(s.end_ns for s in spans)
    assert root.service == "agentruns-worker"
    # one tree: every span but the root hangs from a span of the trace
    for span in spans:
        if span is not root:
            assert span.parent_span_id in ids, f"{span.name} is an orphan"

    slices = by_name(spans, "advance_run")
    assert all(s.parent_span_id == root_id for s in slices)
    workers = {s.attributes["agentruns.worker"] for s in slices}
    assert len(workers) >= 3, "the park, the killed slice and the resume are slices of their own"
    outcomes = [s.attributes.get("agentruns.slice.outcome") for s in slices]
    assert "waiting" in outcomes and "succeeded" in outcomes
    lost = [s for s in slices if s.attributes.get("agentruns.slice.outcome") == "worker_lost"]
    assert lost and all(s.is_error for s in lost), outcomes
    for s in slices:  # a slice's id is the one derived from its lease owner
        assert s.span_id == f"{slice_span_id(finished.id, s.attributes['agentruns.worker']):016x}"
    slice_ids = {s.span_id for s in slices}

    (park,) = by_name(spans, "await_approval")
    assert park.parent_span_id == root_id
    assert park.attributes["agentruns.approval.decided_by"] == "approver"
    assert park.attributes["agentruns.approval.decision"] == "approved"
    assert park.service == "agentruns-web"
    parked_slice = next(s for s in slices if s.attributes["agentruns.slice.outcome"] == "waiting")
    assert park.start_ns >= parked_slice.start_ns and park.end_ns > park.start_ns

    chats = by_name(spans, "chat ")
    assert len(chats) >= 3
    for chat in chats:
        assert chat.name == "chat scripted"
        assert chat.parent_span_id in slice_ids
        attrs = chat.attributes
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.request.model"] == "scripted"
        assert attrs["gen_ai.conversation.id"] == run_id
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0

    tools = by_name(spans, "execute_tool ")
    steps = {s.tool: s for s in Step.objects.filter(run_id=run_id).exclude(tool="")}
    assert {t.attributes["gen_ai.tool.name"] for t in tools} == set(steps)
    for span in tools:
        assert span.parent_span_id in slice_ids
        step = steps[span.attributes["gen_ai.tool.name"]]
        assert span.name == f"execute_tool {step.tool}"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.call.id"] == (step.call_id or str(step.id))
        assert [name for name, _ in span.events] == ["attempt"]
    (refund_span,) = by_name(spans, "execute_tool issue_refund")
    assert refund_span.events[0][1] == {"number": 2, "outcome": "succeeded"}

    # the gateway saw the trace context of the refund's span
    (ledger,) = GatewayRefund.objects.filter(order_id=ORDER)
    assert ledger.traceparent == f"00-{caller_trace}-{refund_span.span_id}-01"

    # no secret in any attribute, event or status (content capture was on)
    email = Order.objects.get(order_id=ORDER).customer_email
    texts = [text for span in receiver.spans for text in span.strings()]
    assert any("gen_ai.output.messages" in s.attributes for s in chats)
    assert not [t for t in texts if email in t], "a redacted value was exported"


def test_trace_libraries_adds_the_request_span(tmp_path, procs, seeded, receiver):
    """AGENTRUNS_TRACE_LIBRARIES=1 on daphne: Django's request span continues the caller's trace
    too, with the database queries under it."""
    lead = get_user_model().objects.get(username="lead")
    web, base = start_web(
        tmp_path, AGENTRUNS_TRACE_LIBRARIES=1, **otel_env(receiver, "agentruns-web")
    )
    procs.append(web)
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    response = httpx.post(
        f"{base}/api/runs",
        json={"agent": "refund", "input": {"order_id": ORDER, "message": "It broke."}},
        headers={
            "Authorization": f"Bearer {create_token(lead)}",
            "traceparent": f"00-{caller_trace}-{caller_span}-01",
        },
        timeout=30,
    )
    assert response.status_code == 201

    def served(spans: list[ReceivedSpan]) -> bool:
        return any(s.trace_id == caller_trace and s.kind == 2 for s in spans)  # SERVER

    receiver.wait_for(served, timeout=30)
    spans = receiver.trace(caller_trace)
    (request,) = [s for s in spans if s.kind == 2]
    assert request.parent_span_id == caller_span
    assert (
        request.attributes.get("http.request.method", request.attributes.get("http.method"))
        == "POST"
    )
    queries = [s for s in spans if s.parent_span_id == request.span_id and s.kind == 3]  # CLIENT
    assert queries, [s.name for s in spans]
