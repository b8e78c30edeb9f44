"""The durable record in the admin: runs, steps, attempts and events, read-only.

The admin is for looking things up, never for changing the record: runs, steps, attempts and
events change only through the engine and the audited services (retry, cancel, resolve).
Every list avoids COUNT(*) over big tables (`show_full_result_count = False`) and pulls related
rows in the same query; everything shown is redacted.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from agentruns.models import (
    Run,
    RunEvent,
    Step,
    StepAttempt,
)
from agentruns.runtime.values.redaction import (
    redact_fields,
    redact_text,
    redact_tool_calls,
    secret_values,
)


class ReadOnlyMixin:
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _step_secrets(step: Step) -> list[str]:
    return secret_values([step.arguments, step.result], step.run.redacted_fields(step.tool))


def _short(value: object) -> str:
    return str(value)[:8]


def run_link(run_id: object) -> str:
    return format_html('<a href="{}">{}</a>', reverse("run-detail", args=[run_id]), _short(run_id))


def pretty_json(value: object) -> str:
    return format_html(
        "<pre>{}</pre>",
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str),
    )


class StepInline(ReadOnlyMixin, admin.TabularInline):
    model = Step
    fields = ("index", "kind", "tool", "status", "attempts", "idempotency_key", "shown_error")
    readonly_fields = fields

    @admin.display(description="error")
    def shown_error(self, obj: Step) -> str:
        return redact_text(obj.error)

    extra = 0
    show_change_link = True
    ordering = ("index",)


class StatusFinishedFilter(admin.SimpleListFilter):
    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request, model_admin):
        return [("failed", "failed"), ("stuck", "waiting or cancel requested")]

    def queryset(self, request, queryset):
        if self.value() == "failed":
            return queryset.filter(status="failed")
        if self.value() == "stuck":
            return queryset.filter(status="waiting") | queryset.filter(cancel_requested=True)
        return queryset


@admin.register(Run)
class RunAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "short_id",
        "agent",
        "status",
        "outcome",
        "step_count",
        "search_text",
        "stop_reason",
        "error_excerpt",
        "tokens",
        "created_at",
        "finished_at",
        "page_link",
    )
    list_filter = (
        StatusFinishedFilter,
        "status",
        "outcome",
        "agent",
        "stop_reason",
        "cancel_requested",
        "created_at",
    )
    search_fields = ("=id", "search_text", "dedupe_key")
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")
    inlines = [StepInline]
    show_full_result_count = False
    list_per_page = 50
    readonly_fields = ("page_link",)
    fieldsets = (
        (
            None,
            {"fields": ("page_link", "id", "agent", "status", "input", "dedupe_key", "created_by")},
        ),
        ("Outcome", {"fields": ("outcome", "output", "shown_error", "stop_reason", "finished_at")}),
        (
            "Limits and usage",
            {
                "fields": (
                    "model",
                    "max_steps",
                    "token_budget",
                    "deadline_at",
                    "step_count",
                    "prompt_tokens",
                    "completion_tokens",
                    "cost_usd",
                )
            },
        ),
        (
            "Execution",
            {
                "classes": ("collapse",),
                "fields": (
                    "lease_owner",
                    "lease_expires_at",
                    "enqueued_at",
                    "cancel_requested",
                    "last_seq",
                    "tool_snapshot",
                    "permissions",
                    "search_text",
                    "started_at",
                    "updated_at",
                ),
            },
        ),
    )

    @admin.display(description="run", ordering="id")
    def short_id(self, obj: Run) -> str:
        return _short(obj.id)

    @admin.display(description="error")
    def error_excerpt(self, obj: Run) -> str:
        return redact_text(obj.error)[:120]

    @admin.display(description="error")
    def shown_error(self, obj: Run) -> str:
        return redact_text(obj.error)

    @admin.display(description="tokens")
    def tokens(self, obj: Run) -> int:
        return obj.total_tokens

    @admin.display(description="timeline")
    def page_link(self, obj: Run) -> str:
        return format_html('<a href="{}">open run page</a>', reverse("run-detail", args=[obj.id]))

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Run._meta.fields if f.name != "error"] + [
            "page_link",
            "shown_error",
        ]


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = StepAttempt
    fields = ("number", "worker", "started_at", "finished_at", "outcome", "shown_error")
    readonly_fields = fields

    @admin.display(description="error")
    def shown_error(self, obj: StepAttempt) -> str:
        return redact_text(obj.error, _step_secrets(obj.step))

    extra = 0
    ordering = ("number",)


@admin.register(Step)
class StepAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "run_link",
        "index",
        "kind",
        "tool",
        "status",
        "attempts",
        "next_attempt_at",
        "idempotency_key",
        "created_at",
    )
    list_filter = ("status", "kind", "tool")
    list_select_related = ("run",)
    search_fields = ("=run__id", "=idempotency_key", "=id")
    inlines = [AttemptInline]
    show_full_result_count = False
    ordering = ("-created_at",)
    # (the replay payload holds what the model and the tools said, secrets included: not shown)
    exclude = ("arguments", "result", "tool_calls", "error", "payload")
    readonly_fields = (
        "run_link",
        "redacted_arguments",
        "redacted_result",
        "redacted_tool_calls",
        "redacted_error",
    )

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Step) -> str:
        return run_link(obj.run_id)

    def _hidden(self, obj: Step) -> list[str]:
        return obj.run.redacted_fields(obj.tool)

    @admin.display(description="arguments (redacted)")
    def redacted_arguments(self, obj: Step) -> object:
        return redact_fields(obj.arguments, self._hidden(obj))

    @admin.display(description="result (redacted)")
    def redacted_result(self, obj: Step) -> object:
        return redact_fields(obj.result, self._hidden(obj))

    @admin.display(description="tool calls (redacted)")
    def redacted_tool_calls(self, obj: Step) -> object:
        return pretty_json(redact_tool_calls(obj.tool_calls, obj.run.redacted_fields))

    @admin.display(description="error (redacted)")
    def redacted_error(self, obj: Step) -> str:
        return redact_text(obj.error, _step_secrets(obj))

    def get_readonly_fields(self, request, obj=None):
        hidden = {"arguments", "result", "run", "tool_calls", "error", "payload"}
        return [*self.readonly_fields] + [f.name for f in Step._meta.fields if f.name not in hidden]


@admin.register(StepAttempt)
class StepAttemptAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "step",
        "number",
        "worker",
        "started_at",
        "duration",
        "outcome",
        "error_excerpt",
    )
    list_filter = ("outcome", "step__kind", "step__tool")
    list_select_related = ("step",)
    search_fields = ("=step__id", "=step__run__id", "worker")
    show_full_result_count = False
    ordering = ("-id",)
    readonly_fields = (
        "step",
        "number",
        "worker",
        "started_at",
        "finished_at",
        "outcome",
        "redacted_error",
        "redacted_traceback",
    )
    exclude = ("error", "traceback")

    @admin.display(description="error (redacted)")
    def redacted_error(self, obj: StepAttempt) -> str:
        return redact_text(obj.error, _step_secrets(obj.step))

    @admin.display(description="traceback (redacted)")
    def redacted_traceback(self, obj: StepAttempt) -> str:
        return format_html("<pre>{}</pre>", redact_text(obj.traceback, _step_secrets(obj.step)))

    @admin.display(description="duration")
    def duration(self, obj: StepAttempt) -> str:
        took = obj.duration_seconds
        return f"{took:.3f} s" if took is not None else "…"

    @admin.display(description="error")
    def error_excerpt(self, obj: StepAttempt) -> str:
        return redact_text(obj.error)[:120]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("run_link", "seq", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("=run__id",)
    show_full_result_count = False
    ordering = ("-id",)
    readonly_fields = ("run", "seq", "type", "redacted_data", "created_at")
    exclude = ("data",)

    @admin.display(description="data")
    def redacted_data(self, obj: RunEvent) -> str:
        # written redacted by the runtime; masked again for rows from before that
        return format_html(
            "<pre>{}</pre>",
            redact_text(json.dumps(obj.data, indent=2, sort_keys=True, ensure_ascii=False)),
        )

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: RunEvent) -> str:
        return run_link(obj.run_id)
