from django.contrib import admin

from .models import Approval


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "agent", "tool", "decided_by", "decided_at", "created_at")
    list_filter = ("kind", "status", "agent", "tool")
    search_fields = ("=run__id",)
    raw_id_fields = ("run", "step")
    readonly_fields = [f.name for f in Approval._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # decisions go through the inbox so they are audited and resume the run
