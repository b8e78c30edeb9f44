"""Operation keys in the admin, read-only: which run executed each key and the leads'
allowances (who, when, why). They change only through the engine and `allow_operation`."""

from __future__ import annotations

from django.contrib import admin

from agentruns.admin.records import ReadOnlyMixin, pretty_json, run_link
from agentruns.models import OperationAllowance, OperationExecution
from agentruns.selectors.operations import shown_result


@admin.register(OperationExecution)
class OperationExecutionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("key", "slot", "state", "tool", "run", "created_at", "settled_at")
    list_filter = ("state", "tool")
    search_fields = ("=key",)
    show_full_result_count = False
    fields = ("key", "slot", "state", "tool", "run", "step_id", "result_shown", "created_at")
    readonly_fields = fields

    @admin.display(description="run")
    def run(self, obj: OperationExecution) -> str:
        return run_link(obj.run_id)

    @admin.display(description="result")
    def result_shown(self, obj: OperationExecution) -> str:
        return pretty_json(shown_result(obj))


@admin.register(OperationAllowance)
class OperationAllowanceAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("key", "slot", "granted_by_name", "created_at", "reason")
    search_fields = ("=key",)
    show_full_result_count = False
