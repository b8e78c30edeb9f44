"""The step spans: `chat {model}` and `execute_tool {tool}`, under the current slice."""

from __future__ import annotations

import json
import logging
from typing import Any

from agentruns.models import Run
from agentruns.runtime.tracing.sdk import (
    NULL_SPAN,
    SLICE_SPAN,
    attach,
    detach,
    fail_span,
    model_names,
    start_span,
    tracer_state,
)
from agentruns.runtime.tracing.tracecontext import (
    format_traceparent,
    run_traceparent,
)
from agentruns.runtime.values.redaction import redact_fields, redact_text, secret_values

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ steps
class _StepSpan:
    def __init__(self, name: str, attributes: dict[str, Any], client: bool = False) -> None:
        self.name, self.attributes, self.client = name, attributes, client
        self.span: Any = None

    def __enter__(self) -> _StepSpan:
        trace_slice = SLICE_SPAN.get()
        parent = None
        if trace_slice is not None:  # siblings under the slice, also for calls made mid-model-step
            from opentelemetry import trace

            parent = trace.set_span_in_context(trace_slice.span)
        self.span = start_span(self.name, parent, attributes=self.attributes, client=self.client)
        self.token = attach(self.span)
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is not None:
                self.span.set_attribute("error.type", type(exc).__name__)
                fail_span(self.span, f"{type(exc).__name__}: {exc}")
            self.finished(exc)
        finally:
            detach(self.token)
            self.span.end()

    def finished(self, exc: BaseException | None) -> None:
        pass


class _ModelSpan(_StepSpan):
    def __init__(self, state: Any, step: Any) -> None:
        self.state = state
        self.index = step.index if step is not None else len(state.steps)
        provider, model = model_names(state.run.model or "")
        super().__init__(
            f"chat {model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": str(state.run_id),
                "agentruns.step.index": self.index,
            },
            client=True,
        )

    def finished(self, exc: BaseException | None) -> None:
        steps = self.state.steps
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
        if tracer_state.capture_content and step.status == "succeeded":
            run = self.state.run
            secrets = _run_secrets(self.state)
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


def _run_secrets(state: Any) -> list[str]:
    """Every value a tool of this run declared secret, so model text echoing one is masked."""
    run = state.run
    values: list[str] = []
    for step in state.steps:
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
        if tracer_state.capture_content:
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


def model_span(state: Any, step: Any) -> Any:
    """Around one model step (`step` None: the step the turn creates)."""
    if state.trace_slice is None:
        return NULL_SPAN
    return _ModelSpan(state, step)


def tool_span(run: Run, step: Any, ctx: Any) -> Any:
    """Around one tool call; gives the call its `traceparent` (ctx.traceparent) either way."""
    if SLICE_SPAN.get() is None:
        ctx.traceparent = run_traceparent(run.id, run.trace_id, run.trace_parent)
        return NULL_SPAN
    return _ToolSpan(run, step, ctx)


def model_attempt_failed(attempt: int, exc: BaseException, *, final: bool) -> None:
    """A failed model attempt, as an event of the current `chat` span."""
    if SLICE_SPAN.get() is None:
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
