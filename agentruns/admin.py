from django.contrib import admin

from .models import ApiToken, Run, RunEvent, Step, StepAttempt, WorkerHeartbeat


class ReadOnlyMixin:
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class StepInline(ReadOnlyMixin, admin.TabularInline):
    model = Step
    fields = ("index", "kind", "tool", "status", "attempts", "idempotency_key", "error")
    readonly_fields = fields
    extra = 0
    show_change_link = True


@admin.register(Run)
class RunAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "agent", "status", "step_count", "search_text", "stop_reason", "created_at", "finished_at")
    list_filter = ("status", "agent", "stop_reason")
    search_fields = ("=id", "search_text", "dedupe_key")
    date_hierarchy = "created_at"
    inlines = [StepInline]
    show_full_result_count = False


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = StepAttempt
    fields = ("number", "worker", "started_at", "finished_at", "outcome", "error")
    readonly_fields = fields
    extra = 0


@admin.register(Step)
class StepAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("run", "index", "kind", "tool", "status", "attempts", "idempotency_key")
    list_filter = ("status", "kind", "tool")
    search_fields = ("=run__id", "idempotency_key")
    raw_id_fields = ("run",)
    inlines = [AttemptInline]
    show_full_result_count = False


@admin.register(StepAttempt)
class StepAttemptAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("step", "number", "worker", "started_at", "finished_at", "outcome")
    list_filter = ("outcome",)
    raw_id_fields = ("step",)
    show_full_result_count = False


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("run", "seq", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("=run__id",)
    raw_id_fields = ("run",)
    show_full_result_count = False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "created_at", "last_used_at", "revoked")
    fields = ("user", "prefix", "created_at", "last_used_at", "revoked")
    readonly_fields = ("user", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request) -> bool:
        return False  # tokens are made with `manage.py create_api_token`


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("worker", "last_seen_at", "last_sweep_at")
