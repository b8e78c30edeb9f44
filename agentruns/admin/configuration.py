"""Configuration in the admin: API tokens (revoke), worker heartbeats, per-group tool policies.

Tool policies are edited here and apply to runs started after the change (each run keeps the
permission snapshot it started with).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from agentruns.admin.records import ReadOnlyMixin
from agentruns.models import ApiToken, ToolPolicy, ToolRule, WorkerHeartbeat
from agentruns.registry import all_agents
from agentruns.selectors.people import username_lookup
from agentruns.tokens import revoke


@admin.action(description="Revoke the selected tokens (refused at once, sockets included)")
def revoke_tokens(modeladmin, request, queryset) -> None:
    count = revoke(queryset)
    modeladmin.message_user(request, f"Revoked {count} token(s).")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "state", "created_at", "expires_at", "last_used_at")
    list_filter = ("revoked",)

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        return ("prefix", username_lookup("user"))

    fields = ("user", "prefix", "state", "created_at", "expires_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    actions = [revoke_tokens]

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return obj.state

    def has_add_permission(self, request) -> bool:
        return False  # tokens are made with `manage.py create_api_token`

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # revoke with the action (or `manage.py revoke_api_token`), nothing else


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("worker", "last_seen_at", "last_sweep_at")
    ordering = ("-last_seen_at",)


def _tool_choices() -> list[tuple[str, str]]:
    names = sorted({name for agent in all_agents().values() for name in agent.tools})
    return [(name, name) for name in names]


class ToolRuleForm(forms.ModelForm):
    # the registered tools (a typo would silently match nothing)
    tool = forms.ChoiceField(choices=_tool_choices)

    class Meta:
        model = ToolRule
        fields = ("tool", "allowed", "approval", "approver_limit")


class ToolRuleInline(admin.TabularInline):
    model = ToolRule
    form = ToolRuleForm
    extra = 1


@admin.register(ToolPolicy)
class ToolPolicyAdmin(admin.ModelAdmin):
    list_display = ("group", "other_tools_allowed", "rule_summary", "note", "updated_at")
    list_select_related = ("group",)
    search_fields = ("group__name", "note")
    fields = ("group", "other_tools_allowed", "note")
    inlines = [ToolRuleInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("rules")

    @admin.display(description="rules")
    def rule_summary(self, obj: ToolPolicy) -> str:
        return "; ".join(
            f"{r.tool}: {'allowed' if r.allowed else 'not allowed'}"
            + (", always approved" if r.approval == "always" else "")
            + (f", approvers up to {r.approver_limit}" if r.approver_limit is not None else "")
            for r in obj.rules.all()
        )
