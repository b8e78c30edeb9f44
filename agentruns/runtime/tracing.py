"""One OpenTelemetry trace per run, under the GenAI semantic conventions.

    invoke_agent {agent}        the run: created_at -> end, emitted by the process that ends it
    ├── advance_run {agent}     one worker's slice (claim -> finish / park / yield / lease lost)
    │   ├── chat {model}        a model step (attempt failures as span events)
    │   └── execute_tool {tool} a tool call (its HTTP calls carry `traceparent`)
    └── await_approval {tool}   park -> decision, emitted by the process that decides

A run outlives processes, so the spans that start in one and end in another are built with
explicit ids and timestamps (`tracecontext.py`): the root span from the run's stored start and a
span id derived from the run id; a slice from the lease owner, so a worker that finds a slice
abandoned by a SIGKILLed one emits that slice, with the id its exported children already name.

Configuration is the SDK's own: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) turns
it on, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*`
are read by the SDK. Unset, `enabled()` is False after one environment read per process, no SDK
module is imported and every hook below is an attribute test that returns a shared null context.
Message content only with `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`, and always
through `redaction.py`: no attribute ever carries a value a tool declared secret.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import uuid
from contextlib import nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import transaction

from agentruns.models import Run, RunEvent, StepAttempt
from agentruns.runtime.redaction import redact_fields, redact_text, secret_values
from agentruns.runtime.tracecontext import (
    caller_flags,
    format_traceparent,
    parse_traceparent,
    root_span_id,
    run_traceparent,
    slice_span_id,
)

log = logging.getLogger(__name__)

_NULL = nullcontext()
_TRUE = {"1", "true", "yes", "on"}
TERMINAL = {"succeeded", "failed", "cancelled"}
# (trace id, span id) the next span must get: how a span is given an id derived from the run
_FORCED_IDS: ContextVar[tuple[int | None, int | None] | None] = ContextVar(
    "agentruns_forced_span_ids", default=None
)
_SLICE: ContextVar[RunSlice | None] = ContextVar("agentruns_trace_slice", default=None)


class _State:
    configured = False
    enabled = False
    capture_content = False
    tracer: Any = None
    provider: Any = None
    lock = threading.Lock()


_state = _State()


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
    if not _state.configured:
        configure()
    return _state.enabled


def configure(*, instrument_database: bool = False) -> None:
    """Set the process's tracer provider up from the OTEL_* variables (once per process: a
    forked q2 worker keeps its parent's, whose batch processor restarts its thread on fork)."""
    with _state.lock:
        if _state.configured:
            return
        _state.configured = True
        _state.enabled = _wanted()
        if not _state.enabled:
            return
        capture = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
        _state.capture_content = capture.strip().lower() in _TRUE
        if _state.provider is not None:  # the global provider is set once per process
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
        _state.provider = provider
        _state.tracer = provider.get_tracer("agentruns")
        if instrument_database:
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

            PsycopgInstrumentor().instrument(tracer_provider=provider)


def reset_for_tests() -> None:
    """Read the OTEL_* variables again at the next span (tests switch tracing on and off). The
    provider, once built, stays: OpenTelemetry's global provider can be set once per process."""
    with _state.lock:
        if _state.provider is not None:
            _state.provider.force_flush()
        _state.configured = _state.enabled = _state.capture_content = False


def flush(timeout_ms: int = 5000) -> None:
    if _state.provider is not None:
        _state.provider.force_flush(timeout_ms)


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


def _remote(trace_id: str, span_id: int, flags: int) -> Any:
    from opentelemetry import trace

    context = trace.SpanContext(
        int(trace_id, 16), span_id, is_remote=True, trace_flags=trace.TraceFlags(flags)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def _root_context(run: Run) -> Any:
    return _remote(run.trace_id, root_span_id(run.id), caller_flags(run.trace_parent))


def _start(
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
        return _state.tracer.start_span(
            name,
            context=parent if parent is not None else Context(),
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(start),
        )
    finally:
        _FORCED_IDS.reset(token)


def _fail(span: Any, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, redact_text(message)[:500]))


def _attach(span: Any) -> Any:
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def _detach(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)


def model_names(model: str) -> tuple[str, str]:
    """(gen_ai.provider.name, gen_ai.request.model) of an AGENTRUNS_MODEL value."""
    for separator in ("/", ":"):
        provider, found, name = model.partition(separator)
        if found:
            return provider, name
    return model, model


def _run_attributes(run: Run) -> dict[str, Any]:
    return {"gen_ai.conversation.id": str(run.id), "gen_ai.agent.name": run.agent}


# ------------------------------------------------------------------ the run and its slices
class RunSlice:
    """The live `advance_run` span of one executor, current while it drives the run."""

    def __init__(self, executor: Any) -> None:
        run = executor.run
        self.run = run
        self.lost_owners: set[str] = set()
        self.span = _start(
            f"advance_run {run.agent}",
            _root_context(run),
            span_id=slice_span_id(run.id, executor.owner),
            attributes={**_run_attributes(run), "agentruns.worker": executor.owner},
        )
        self.token = _attach(self.span)
        self.slice_token = _SLICE.set(self)

    def end(self, outcome: str) -> None:
        self.span.set_attribute("agentruns.slice.outcome", outcome)
        if outcome == "lease_lost":
            _fail(self.span, "the lease was lost; another worker continues")
        _SLICE.reset(self.slice_token)
        _detach(self.token)
        self.span.end()
        if outcome in TERMINAL:
            _emit_safely(self.run.id)


def sliced(advance: Any) -> Any:
    """Decorates `RunExecutor.advance`: the slice `_drive` began ends with its outcome."""

    @functools.wraps(advance)
    def traced(executor: Any, *args: Any, **kwargs: Any) -> str:
        executor.trace_slice = None
        outcome = "error"
        try:
            outcome = advance(executor, *args, **kwargs)
            return outcome
        finally:
            end_slice(executor.trace_slice, outcome)

    return traced


def begin_slice(executor: Any) -> RunSlice | None:
    """Called once the executor has loaded its run; None (and nothing else) when tracing is off."""
    if not enabled() or not executor.run.trace_id:
        return None
    try:
        return RunSlice(executor)
    except Exception:  # tracing must never stop a run
        log.warning("could not start the slice span of run %s", executor.run_id, exc_info=True)
        return None


def end_slice(trace_slice: RunSlice | None, outcome: str) -> None:
    if trace_slice is None:
        return
    try:
        trace_slice.end(outcome)
    except Exception:
        log.warning("could not end the slice span of run %s", trace_slice.run.id, exc_info=True)


def run_ended_on_commit(run_id: uuid.UUID) -> None:
    """A run ended outside any executor (cancelled while parked or abandoned): its root span."""
    if enabled():
        transaction.on_commit(lambda: _emit_safely(run_id))


def _emit_safely(run_id: uuid.UUID) -> None:
    try:
        emit_run_span(run_id)
    except Exception:
        log.warning("could not emit the root span of run %s", run_id, exc_info=True)


def emit_run_span(run_id: uuid.UUID) -> None:
    """The root span, built at the run's end from what is stored: its start, its outcome."""
    run = Run.objects.only(
        "id", "agent", "model", "status", "error", "stop_reason", "trace_id", "trace_parent",
        "created_at", "finished_at", "prompt_tokens", "completion_tokens", "step_count",
    ).get(id=run_id)  # fmt: skip
    if not run.trace_id:
        return
    parsed = parse_traceparent(run.trace_parent)
    parent = _remote(parsed[0], int(parsed[1], 16), parsed[2]) if parsed else None
    provider, model = model_names(run.model or "")
    span = _start(
        f"invoke_agent {run.agent}",
        parent,
        start=run.created_at,
        span_id=root_span_id(run.id),
        trace_id=int(run.trace_id, 16),
        attributes={
            **_run_attributes(run),
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": run.prompt_tokens,
            "gen_ai.usage.output_tokens": run.completion_tokens,
            "agentruns.run.status": run.status,
            "agentruns.run.steps": run.step_count,
            "agentruns.run.stop_reason": run.stop_reason,
        },
    )
    if run.status == "failed":
        _fail(span, run.error or run.stop_reason)
    span.end()  # now: after the last slice, which ends once the run's final commit is made


def worker_lost(executor: Any, step: Any) -> None:
    """`step` was left running by a dead executor: emit that executor's slice, ended now, so its
    already-exported children hang under it and the crash shows as two slices of one trace."""
    trace_slice = executor.trace_slice
    if trace_slice is None:
        return
    try:
        row = StepAttempt.objects.filter(step_id=step.id, number=step.attempts).first()
        dead = row.worker if row is not None else ""
        if not dead or dead == executor.owner or dead in trace_slice.lost_owners:
            return
        trace_slice.lost_owners.add(dead)
        first = (
            StepAttempt.objects.filter(step__run_id=executor.run_id, worker=dead)
            .order_by("started_at")
            .values_list("started_at", flat=True)
            .first()
        )
        run = executor.run
        span = _start(
            f"advance_run {run.agent}",
            _root_context(run),
            start=first or row.started_at,
            span_id=slice_span_id(run.id, dead),
            attributes={
                **_run_attributes(run),
                "agentruns.worker": dead,
                "agentruns.slice.outcome": "worker_lost",
                "agentruns.slice.recovered_by": executor.owner,
            },
        )
        _fail(span, "the worker died mid-step; its lease lapsed and another worker resumed")
        span.end()
    except Exception:
        log.warning("could not emit the lost slice of run %s", executor.run_id, exc_info=True)


# ------------------------------------------------------------------ steps
class _StepSpan:
    def __init__(self, name: str, attributes: dict[str, Any], client: bool = False) -> None:
        self.name, self.attributes, self.client = name, attributes, client
        self.span: Any = None

    def __enter__(self) -> _StepSpan:
        trace_slice = _SLICE.get()
        parent = None
        if trace_slice is not None:  # siblings under the slice, also for calls made mid-model-step
            from opentelemetry import trace

            parent = trace.set_span_in_context(trace_slice.span)
        self.span = _start(self.name, parent, attributes=self.attributes, client=self.client)
        self.token = _attach(self.span)
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is not None:
                self.span.set_attribute("error.type", type(exc).__name__)
                _fail(self.span, f"{type(exc).__name__}: {exc}")
            self.finished(exc)
        finally:
            _detach(self.token)
            self.span.end()

    def finished(self, exc: BaseException | None) -> None:
        pass


class _ModelSpan(_StepSpan):
    def __init__(self, executor: Any, step: Any) -> None:
        self.executor = executor
        self.index = step.index if step is not None else len(executor.steps)
        provider, model = model_names(executor.run.model or "")
        super().__init__(
            f"chat {model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": str(executor.run_id),
                "agentruns.step.index": self.index,
            },
            client=True,
        )

    def finished(self, exc: BaseException | None) -> None:
        steps = self.executor.steps
        step = steps[self.index] if self.index < len(steps) else None
        if step is None:
            return
        self.span.set_attribute("gen_ai.usage.input_tokens", step.prompt_tokens)
        self.span.set_attribute("gen_ai.usage.output_tokens", step.completion_tokens)
        self.span.set_attribute("agentruns.step.attempts", step.attempts)
        if step.tool_calls:
            self.span.set_attribute("gen_ai.response.finish_reasons", ["tool_calls"])
        elif step.status == "succeeded":
            self.span.set_attribute("gen_ai.response.finish_reasons", ["stop"])
        if _state.capture_content and step.status == "succeeded":
            run = self.executor.run
            secrets = _run_secrets(self.executor)
            parts: list[dict] = [{"type": "text", "content": redact_text(step.text, secrets)}]
            for call in step.tool_calls or []:
                args = redact_fields(call.get("arguments"), run.redacted_fields(call.get("name")))
                parts.append(
                    {
                        "type": "tool_call",
                        "id": call.get("id"),
                        "name": call.get("name"),
                        "arguments": args,
                    }
                )
            output = json.dumps([{"role": "assistant", "parts": parts}], default=str)
            self.span.set_attribute("gen_ai.output.messages", redact_text(output, secrets))


def _run_secrets(executor: Any) -> list[str]:
    """Every value a tool of this run declared secret, so model text echoing one is masked."""
    run = executor.run
    values: list[str] = []
    for step in executor.steps:
        if step.tool:
            values += secret_values([step.arguments, step.result], run.redacted_fields(step.tool))
    return values


class _ToolSpan(_StepSpan):
    def __init__(self, run: Run, step: Any, ctx: Any) -> None:
        self.run, self.step, self.ctx = run, step, ctx
        super().__init__(
            f"execute_tool {step.tool}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": step.tool,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": step.call_id or str(step.id),
                "gen_ai.conversation.id": str(run.id),
                "agentruns.step.index": step.index,
                "agentruns.step.attempt": ctx.attempt,
            },
        )

    def __enter__(self) -> _ToolSpan:
        super().__enter__()
        context = self.span.get_span_context()
        self.ctx.traceparent = format_traceparent(
            context.trace_id, context.span_id, int(context.trace_flags)
        )
        return self

    def result(self, value: Any) -> None:
        if _state.capture_content:
            fields = self.run.redacted_fields(self.step.tool)
            secrets = secret_values([self.step.arguments, value], fields)
            for name, data in (
                ("gen_ai.tool.call.arguments", self.step.arguments),
                ("gen_ai.tool.call.result", value),
            ):
                text = json.dumps(redact_fields(data, fields), default=str)
                self.span.set_attribute(name, redact_text(text, secrets))

    def finished(self, exc: BaseException | None) -> None:
        outcome = "succeeded" if exc is None else "failed"
        attributes = {"number": self.ctx.attempt, "outcome": outcome}
        if exc is not None:
            attributes["error"] = redact_text(f"{type(exc).__name__}", [])
        self.span.add_event("attempt", attributes)


def model_span(executor: Any, step: Any) -> Any:
    """Around one model step (`step` None: the step the turn creates)."""
    if executor.trace_slice is None:
        return _NULL
    return _ModelSpan(executor, step)


def tool_span(run: Run, step: Any, ctx: Any) -> Any:
    """Around one tool call; gives the call its `traceparent` (ctx.traceparent) either way."""
    if _SLICE.get() is None:
        ctx.traceparent = run_traceparent(run.id, run.trace_id, run.trace_parent)
        return _NULL
    return _ToolSpan(run, step, ctx)


def model_attempt_failed(attempt: int, exc: BaseException, *, final: bool) -> None:
    """A failed model attempt, as an event of the current `chat` span."""
    if _SLICE.get() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(
        "attempt",
        {
            "number": attempt,
            "outcome": "failed" if final else "retrying",
            "error": redact_text(str(exc))[:300],
        },
    )


# ------------------------------------------------------------------ the park
def approvals_decided(run_id: uuid.UUID | str, events: list[tuple[str, dict]]) -> None:
    """A decision resumed (or settled) a parked run: its `await_approval` span, on commit."""
    if not enabled():
        return
    decided = [data for kind, data in events if kind == "approval.decided"]
    if decided:
        transaction.on_commit(lambda: _emit_await_approval(uuid.UUID(str(run_id)), decided))


def _emit_await_approval(run_id: uuid.UUID, decided: list[dict]) -> None:
    try:
        run = Run.objects.only("id", "agent", "trace_id", "trace_parent").get(id=run_id)
        if not run.trace_id:
            return
        for data in decided:
            parked_at = (
                RunEvent.objects.filter(
                    run_id=run_id, type="approval.requested", data__step=data.get("step")
                )
                .order_by("-seq")
                .values_list("created_at", flat=True)
                .first()
            )
            span = _start(
                f"await_approval {data.get('tool') or ''}".strip(),
                _root_context(run),
                start=parked_at,
                attributes={
                    **_run_attributes(run),
                    "agentruns.approval.id": data.get("approval") or 0,
                    "agentruns.approval.kind": data.get("kind") or "",
                    "agentruns.approval.decision": data.get("decision") or "",
                    "agentruns.approval.decided_by": data.get("by") or "",
                    "agentruns.step.index": data.get("step") or 0,
                    "gen_ai.tool.name": data.get("tool") or "",
                },
            )
            span.end()
    except Exception:
        log.warning("could not emit the approval span of run %s", run_id, exc_info=True)
