"""Tracing in one process (agentruns/runtime/tracing.py), exported over real OTLP/HTTP to the
test's receiver: the span tree of a run, GenAI attributes, message content only when asked for
and always redacted, spans of other libraries nested under ours, and nothing at all (not even an
SDK import) when no OTEL_* variable is set. The multi-process trace (park, SIGKILL, resume):
tests/crash/test_run_trace.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentruns.models import Run
from agentruns.runtime import tracing
from agentruns.runtime.tracing.tracecontext import (
    new_run_trace,
    parse_traceparent,
    root_span_id,
    run_traceparent,
)
from tests import testkit
from tests.helpers import advance, script_run
from tests.otlp_receiver import OtlpReceiver
from tests.procs import ROOT, base_env
from tests.testkit import OPS_AGENT

SECRET_KEY_ARG = "sk-live-0123456789abcdef"
EMAIL = "bob@example.com"


@pytest.fixture(scope="module")
def receiver():
    received = OtlpReceiver().start()
    yield received
    received.stop()


@pytest.fixture
def traced(receiver, monkeypatch):
    """Tracing on for this test (to the receiver), off again afterwards."""

    def switch(capture: bool) -> OtlpReceiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv(
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true" if capture else "false"
        )
        tracing.reset_for_tests()
        assert tracing.enabled()
        return receiver

    yield switch
    tracing.reset_for_tests()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    tracing.reset_for_tests()


def lookup_then_answer() -> list[dict]:
    return [
        {"calls": [["ops_lookup", {"customer": "bob", "api_key": SECRET_KEY_ARG}]]},
        {"calls": [["t_echo", {"text": "hi"}]]},
        # the model echoes a secret value: the exported text must not
        {"text": f"Mailed {EMAIL} (key {SECRET_KEY_ARG})."},
    ]


def run_spans(receiver: OtlpReceiver, run) -> list:
    tracing.flush()
    receiver.wait_for(
        lambda spans: any(
            s.name.startswith("invoke_agent") and s.trace_id == run.trace_id for s in spans
        ),
        timeout=30,
    )
    return receiver.trace(run.trace_id)


@pytest.mark.django_db
def test_a_run_is_one_tree_with_genai_attributes_and_redacted_content(traced):
    receiver = traced(capture=True)
    run = advance(script_run(lookup_then_answer(), agent=OPS_AGENT))
    assert run.status == "succeeded"
    spans = run_spans(receiver, run)
    names = sorted(s.name for s in spans)
    assert names == [
        "advance_run ops-script",
        "chat scripted",
        "chat scripted",
        "chat scripted",
        "execute_tool ops_lookup",
        "execute_tool t_echo",
        "invoke_agent ops-script",
    ]
    by_name = {s.name: s for s in spans}
    root, slice_ = by_name["invoke_agent ops-script"], by_name["advance_run ops-script"]
    assert root.span_id == f"{root_span_id(run.id):016x}" and root.parent_span_id == ""
    assert slice_.parent_span_id == root.span_id
    assert all(s.parent_span_id == slice_.span_id for s in spans if s not in (root, slice_))
    assert root.attributes["gen_ai.usage.input_tokens"] == run.prompt_tokens > 0
    lookup = by_name["execute_tool ops_lookup"]
    assert lookup.attributes["gen_ai.tool.name"] == "ops_lookup"
    assert lookup.events == [("attempt", {"number": 1, "outcome": "succeeded"})]
    # content was asked for: it is there, masked
    assert "gen_ai.tool.call.arguments" in lookup.attributes
    outputs = [s.attributes.get("gen_ai.output.messages", "") for s in spans]
    assert any("Mailed" in text for text in outputs)
    texts = [t for s in spans for t in s.strings()]
    assert not [t for t in texts if SECRET_KEY_ARG in t or EMAIL in t]


@pytest.mark.django_db
def test_no_content_unless_asked_and_failures_are_errors(traced):
    receiver = traced(capture=False)
    testkit.FAILS["t_charge"] = 1  # the first attempt fails, the retry succeeds
    run = advance(
        script_run([{"calls": [["t_charge", {"amount": 1}]]}, {"text": "done"}], agent=OPS_AGENT)
    )
    assert run.status == "succeeded"
    spans = run_spans(receiver, run)
    charges = [s for s in spans if s.name == "execute_tool t_charge"]
    assert [s.is_error for s in charges] == [True, False]
    assert charges[0].events[0][1]["outcome"] == "failed"
    assert [s.events[0][1]["number"] for s in charges] == [1, 2]
    for span in spans:
        assert not {k for k in span.attributes if k.startswith("gen_ai.") and "messages" in k}
        assert "gen_ai.tool.call.arguments" not in span.attributes


@pytest.mark.django_db
def test_a_libraries_spans_nest_under_the_step_and_tools_get_the_traceparent(traced):
    """What an instrumented HTTP client or model SDK does: a span of its own, on the global
    tracer provider, in the current context."""
    from opentelemetry import trace

    receiver = traced(capture=False)
    seen: dict = {}

    def library_call(name: str, ctx) -> None:
        seen["traceparent"] = ctx.traceparent
        with trace.get_tracer("some.library").start_as_current_span("GET /orders"):
            pass

    testkit.HOOKS["t_echo"] = library_call
    try:
        run = advance(script_run([{"calls": [["t_echo", {"text": "x"}]]}, {"text": "ok"}]))
    finally:
        testkit.HOOKS.pop("t_echo", None)
    spans = run_spans(receiver, run)
    (tool,) = [s for s in spans if s.name == "execute_tool t_echo"]
    (library,) = [s for s in spans if s.name == "GET /orders"]
    assert library.parent_span_id == tool.span_id
    assert seen["traceparent"] == f"00-{run.trace_id}-{tool.span_id}-01"


@pytest.mark.django_db
def test_without_tracing_a_tool_still_gets_the_runs_traceparent():
    assert not tracing.enabled()
    seen: dict = {}
    testkit.HOOKS["t_echo"] = lambda name, ctx: seen.update(traceparent=ctx.traceparent)
    try:
        run = advance(script_run([{"calls": [["t_echo", {"text": "x"}]]}, {"text": "ok"}]))
    finally:
        testkit.HOOKS.pop("t_echo", None)
    assert seen["traceparent"] == run_traceparent(run.id, run.trace_id)
    assert parse_traceparent(seen["traceparent"])[0] == run.trace_id


def test_traceparent_parsing():
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_traceparent(f"00-{trace}-00f067aa0ba902b7-01") == (trace, "00f067aa0ba902b7", 1)
    assert parse_traceparent(f"01-{trace}-00f067aa0ba902b7-00-future") == (
        trace,
        "00f067aa0ba902b7",
        0,
    )
    for bad in (
        None,
        "",
        f"00-{trace}-00f067aa0ba902b7-01-extra",  # version 00 has no more fields
        f"ff-{trace}-00f067aa0ba902b7-01",
        f"00-{'0' * 32}-00f067aa0ba902b7-01",
        f"00-{trace}-{'0' * 16}-01",
        f"00-{trace[:-1]}-00f067aa0ba902b7-01",
    ):
        assert parse_traceparent(bad) is None, bad
    trace_id, parent = new_run_trace("garbage")
    assert len(trace_id) == 32 and parent == ""


@pytest.mark.django_db(transaction=True)
def test_unset_nothing_is_imported_or_exported():
    """A whole run in a fresh process without OTEL_* variables: no OpenTelemetry SDK or exporter
    module loaded, no tracer provider installed, so no span is recorded and nothing can be sent.

    The OpenTelemetry *API* does load: pydantic-ai imports it (the demo's refund agent is a
    Pydantic AI agent, the scripted model a FunctionModel), and without an SDK every tracer it
    hands out is the API's no-op proxy. The promise is no SDK, no exporter, nothing recorded."""
    env = {k: v for k, v in base_env().items() if not k.startswith("OTEL_")}
    env["AGENTRUNS_AGENT_MODULES"] = "tests.testkit"
    code = (
        "import json, os, sys, django; django.setup()\n"
        "from agentruns.services import execute_inline\n"
        "from agentruns.runtime import tracing\n"
        "script = [{'calls': [['t_echo', {'text': 'x'}]]}, {'text': 'ok'}]\n"
        "_, outcome = execute_inline('script', {'script': script})\n"
        "assert outcome == 'succeeded', outcome\n"
        "from opentelemetry import trace\n"
        "span = trace.get_tracer('probe').start_span('probe')\n"
        "print(json.dumps({'sdk': sorted(m for m in sys.modules if m.startswith(\n"
        "    ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.instrumentation'))),\n"
        "    'provider': type(trace.get_tracer_provider()).__name__,\n"
        "    'recording': span.is_recording(), 'enabled': tracing.enabled()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "sdk": [],
        "provider": "ProxyTracerProvider",  # none installed: the API's no-op
        "recording": False,
        "enabled": False,
    }
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ


@pytest.mark.django_db
def test_a_park_and_a_cancel_of_the_parked_run(traced, lead, django_capture_on_commit_callbacks):
    """The park's span from park to decision (who decided), and the root span of a run that
    ended while nobody executed it, from the process that ended it."""
    from agentruns.services import cancel_run
    from approvals.models import Approval
    from approvals.services import approve

    receiver = traced(capture=False)
    decided = advance(
        script_run([{"calls": [["t_pay", {"amount": 500}]]}, {"text": "paid"}], agent=OPS_AGENT)
    )
    assert decided.status == "waiting"
    with django_capture_on_commit_callbacks(execute=True):
        approve(Approval.objects.get(run=decided).id, user=lead)
    decided = advance(decided)
    assert decided.status == "succeeded"
    cancelled = advance(script_run([{"calls": [["t_pay", {"amount": 700}]]}], agent=OPS_AGENT))
    with django_capture_on_commit_callbacks(execute=True):
        cancel_run(cancelled.id, user=lead)

    spans = run_spans(receiver, decided)
    (park,) = [s for s in spans if s.name == "await_approval t_pay"]
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert park.parent_span_id == root.span_id
    assert park.attributes["agentruns.approval.decided_by"] == "lead"
    assert park.attributes["agentruns.approval.decision"] == "approved"
    slices = sorted(
        (s for s in spans if s.name.startswith("advance_run")), key=lambda s: s.start_ns
    )
    assert [s.attributes["agentruns.slice.outcome"] for s in slices] == ["waiting", "succeeded"]
    assert slices[0].end_ns <= park.end_ns <= slices[1].start_ns

    other = run_spans(receiver, Run.objects.get(id=cancelled.id))
    (root,) = [s for s in other if s.name.startswith("invoke_agent")]
    assert root.attributes["agentruns.run.status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_trace_libraries_adds_query_spans_under_the_step(receiver):
    """AGENTRUNS_TRACE_LIBRARIES=1 (in a process of its own: the instrumentation patches psycopg
    for the whole process): the queries of a tool call are spans under its execute_tool span."""
    env = {k: v for k, v in base_env().items() if not k.startswith("OTEL_")}
    env.update(
        AGENTRUNS_AGENT_MODULES="tests.testkit",
        AGENTRUNS_TRACE_LIBRARIES="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_SERVICE_NAME="agentruns-db-traced",
    )
    code = (
        "import django; django.setup()\n"
        "from agentruns.runtime import tracing\n"
        "from agentruns.services import execute_inline\n"
        "script = [{'calls': [['t_tx', {'amount': 3}]]}, {'text': 'ok'}]\n"
        "run, outcome = execute_inline('script', {'script': script})\n"
        "assert outcome == 'succeeded', outcome\n"
        "tracing.flush()\n"
        "print(run.trace_id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trace_id = done.stdout.strip().splitlines()[-1]
    spans = receiver.trace(trace_id)
    (tool,) = [s for s in spans if s.name == "execute_tool t_tx"]
    queries = [s for s in spans if s.parent_span_id == tool.span_id]
    system = [s.attributes.get("db.system", s.attributes.get("db.system.name")) for s in queries]
    assert queries and set(system) == {"postgresql"}
