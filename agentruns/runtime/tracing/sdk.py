"""The SDK side of run tracing: configuration from OTEL_*, and spans with explicit ids."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from agentruns.models import Run
from agentruns.runtime.tracing.tracecontext import (
    caller_flags,
    root_span_id,
)
from agentruns.runtime.values.redaction import redact_text

log = logging.getLogger(__name__)

NULL_SPAN = nullcontext()
_TRUE = {"1", "true", "yes", "on"}
TERMINAL = {"succeeded", "failed", "cancelled"}
# (trace id, span id) the next span must get: how a span is given an id derived from the run
_FORCED_IDS: ContextVar[tuple[int | None, int | None] | None] = ContextVar(
    "agentruns_forced_span_ids", default=None
)
# the RunSlice (runs.py) of the executor driving a run in this context
SLICE_SPAN: ContextVar[Any] = ContextVar("agentruns_trace_slice", default=None)


class _State:
    configured = False
    enabled = False
    capture_content = False
    tracer: Any = None
    provider: Any = None
    lock = threading.Lock()


tracer_state = _State()


def _wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    if not tracer_state.configured:
        configure()
    return tracer_state.enabled


def configure(*, instrument_libraries: bool = False) -> None:
    """Set the process's tracer provider up from the OTEL_* variables (once per process: a
    forked q2 worker keeps its parent's, whose batch processor restarts its thread on fork)."""
    with tracer_state.lock:
        if tracer_state.configured:
            return
        tracer_state.configured = True
        tracer_state.enabled = _wanted()
        if not tracer_state.enabled:
            return
        capture = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
        tracer_state.capture_content = capture.strip().lower() in _TRUE
        if tracer_state.provider is not None:  # the global provider is set once per process
            return
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": "agentruns"})
        provider = TracerProvider(resource=resource, id_generator=_run_id_generator())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        # global, so a model layer's own GenAI spans (Pydantic AI's instrumentation) nest under
        # our step spans through the current context instead of forming a second tree
        trace.set_tracer_provider(provider)
        tracer_state.provider = provider
        tracer_state.tracer = provider.get_tracer("agentruns")
        if instrument_libraries:  # before Django builds its middleware stack (apps.ready)
            from opentelemetry.instrumentation.django import DjangoInstrumentor
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

            DjangoInstrumentor().instrument(tracer_provider=provider)
            PsycopgInstrumentor().instrument(tracer_provider=provider)


def reset_for_tests() -> None:
    """Read the OTEL_* variables again at the next span (tests switch tracing on and off). The
    provider, once built, stays: OpenTelemetry's global provider can be set once per process."""
    with tracer_state.lock:
        if tracer_state.provider is not None:
            tracer_state.provider.force_flush()
        tracer_state.configured = tracer_state.enabled = tracer_state.capture_content = False


def flush(timeout_ms: int = 5000) -> None:
    if tracer_state.provider is not None:
        tracer_state.provider.force_flush(timeout_ms)


def _run_id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIdGenerator(RandomIdGenerator):
        """Random ids, except for the spans whose ids are derived from the run."""

        def generate_span_id(self) -> int:
            forced = _FORCED_IDS.get()
            return forced[1] if forced and forced[1] else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _FORCED_IDS.get()
            return forced[0] if forced and forced[0] else super().generate_trace_id()

    return RunIdGenerator()


# ------------------------------------------------------------------ building spans
def _ns(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1_000_000_000)


def remote_parent(trace_id: str, span_id: int, flags: int) -> Any:
    from opentelemetry import trace

    context = trace.SpanContext(
        int(trace_id, 16), span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def root_context(run: Run) -> Any:
    """The run's root span as a remote parent. Its sampled flag is the caller's, or, for a trace
    the run began, the configured sampler's verdict on the trace id (the ratio samplers decide by
    the trace id alone), so every process keeps or drops the same runs."""
    if run.trace_parent:
        flags = caller_flags(run.trace_parent)
    else:
        from opentelemetry.context import Context

        verdict = tracer_state.provider.sampler.should_sample(
            Context(), int(run.trace_id, 16), f"invoke_agent {run.agent}"
        )
        flags = 0x01 if verdict.decision.is_sampled() else 0x00
    return remote_parent(run.trace_id, root_span_id(run.id), flags)


def start_span(
    name: str,
    parent: Any,
    *,
    start: datetime | None = None,
    span_id: int | None = None,
    trace_id: int | None = None,
    attributes: dict[str, Any] | None = None,
    client: bool = False,
) -> Any:
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    token = _FORCED_IDS.set((trace_id, span_id))
    try:
        return tracer_state.tracer.start_span(
            name,
            context=parent if parent is not None else Context(),
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(start),
        )
    finally:
        _FORCED_IDS.reset(token)


def fail_span(span: Any, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, redact_text(message)[:500]))


def attach(span: Any) -> Any:
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def detach(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)


def model_names(model: str) -> tuple[str, str]:
    """(gen_ai.provider.name, gen_ai.request.model) of an AGENTRUNS_MODEL value."""
    for separator in ("/", ":"):
        provider, found, name = model.partition(separator)
        if found:
            return provider, name
    return model, model


def run_attributes(run: Run) -> dict[str, Any]:
    return {"gen_ai.conversation.id": str(run.id), "gen_ai.agent.name": run.agent}
