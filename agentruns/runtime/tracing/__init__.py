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

from agentruns.runtime.tracing.runs import (
    approvals_decided,
    begin_slice,
    emit_run_span,
    end_slice,
    run_ended_on_commit,
    sliced,
    worker_lost,
)
from agentruns.runtime.tracing.sdk import configure, enabled, flush, model_names, reset_for_tests
from agentruns.runtime.tracing.steps import model_attempt_failed, model_span, tool_span

__all__ = [
    "approvals_decided",
    "begin_slice",
    "configure",
    "emit_run_span",
    "enabled",
    "end_slice",
    "flush",
    "model_attempt_failed",
    "model_names",
    "model_span",
    "reset_for_tests",
    "run_ended_on_commit",
    "sliced",
    "tool_span",
    "worker_lost",
]
