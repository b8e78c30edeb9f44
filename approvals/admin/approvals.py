"""The audit view of decisions: who, when, what was requested, what was approved (read-only)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from agentruns.runtime.values.money import format_cents
from agentruns.selectors.people import username_lookup
from approvals.domain.decisions import args_diff
from approvals.models import Approval


def pretty_json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "status",
        "agent",
        "tool",
        "amount",
        "edited",
        "decided_by",
        "decided_at",
        "created_at",
    )
    list_filter = ("kind", "status", "agent", "tool", "resolution")
    list_select_related = ("decided_by",)

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        return ("=run__id", "=id", username_lookup("decided_by"), "reason")

    date_hierarchy = "created_at"
    fieldsets = (
        (None, {"fields": ("kind", "status", "agent", "tool", "run_link", "step_link")}),
        (
            "Decision",
            {
                "fields": (
                    "decided_by",
                    "decided_at",
                    "reason",
                    "internal_note",
                    "resolution",
                    "expires_at",
                )
            },
        ),
        ("Claim and due time", {"fields": ("claimed_by", "claimed_at", "due_at", "escalated_at")}),
        (
            "Approvers (one row per person's decision)",
            {"fields": ("approvals_required", "approvals_given", "round", "decision_rows")},
        ),
        ("Arguments", {"fields": ("requested", "approved", "changes", "resolution_payload")}),
        ("Earlier decisions on this step", {"fields": ("earlier_decisions",)}),
        ("Timestamps", {"fields": ("created_at",)}),
    )
    readonly_fields = (
        "kind",
        "status",
        "agent",
        "tool",
        "run_link",
        "step_link",
        "decided_by",
        "decided_at",
        "reason",
        "internal_note",
        "resolution",
        "expires_at",
        "claimed_by",
        "claimed_at",
        "due_at",
        "escalated_at",
        "requested",
        "approved",
        "changes",
        "resolution_payload",
        "earlier_decisions",
        "created_at",
        "approvals_required",
        "approvals_given",
        "round",
        "decision_rows",
    )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        # viewing is allowed (the audit); decisions go through the inbox so they are audited
        # on the run's timeline and resume the run
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the audit trail is not editable

    @admin.display(description="earlier decisions")
    def earlier_decisions(self, obj: Approval):
        if not obj.history:
            return "—"
        return format_html_join(
            mark_safe("<br>"),
            "{} {} by {} at {}{}",
            (
                (
                    entry.get("kind"),
                    entry.get("status"),
                    entry.get("decided_by") or "—",
                    entry.get("decided_at") or "—",
                    f" ({entry['reason']})" if entry.get("reason") else "",
                )
                for entry in obj.history
            ),
        )

    @admin.display(description="decisions")
    def decision_rows(self, obj: Approval):
        rows = list(obj.decisions.all())
        if not rows:
            return "—"
        return format_html_join(
            mark_safe("<br>"),
            "round {}: {} {} at {}{}{}{}",
            (
                (
                    d.round,
                    d.username or "the system",
                    d.decision,
                    d.decided_at.isoformat(timespec="seconds"),
                    f" with {pretty_json(obj.redacted(d.args))}" if d.edited else "",
                    f" ({d.reason})" if d.reason else "",
                    f" [internal note: {d.internal_note}]" if d.internal_note else "",
                )
                for d in rows
            ),
        )

    @admin.display(description="amount")
    def amount(self, obj: Approval):
        cents = obj.amount_cents
        return format_cents(cents) if cents is not None else "—"

    @admin.display(boolean=True, description="edited")
    def edited(self, obj: Approval) -> bool:
        return obj.edited_args is not None

    @admin.display(description="run")
    def run_link(self, obj: Approval):
        return format_html(
            '<a href="{}">{}</a>', reverse("run-detail", args=[obj.run_id]), obj.run_id
        )

    @admin.display(description="step")
    def step_link(self, obj: Approval):
        return f"#{obj.step.index} {obj.step.tool} ({obj.step.status})"

    @admin.display(description="requested")
    def requested(self, obj: Approval):
        return format_html("<pre>{}</pre>", pretty_json(obj.visible_args()))

    @admin.display(description="approved")
    def approved(self, obj: Approval):
        if obj.status != "approved":
            return "—"
        return format_html("<pre>{}</pre>", pretty_json(obj.redacted(obj.effective_args)))

    @admin.display(description="changes")
    def changes(self, obj: Approval):
        if obj.edited_args is None:
            return "none"
        diff = args_diff(obj.visible_args(), obj.redacted(obj.edited_args))
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li><code>{}</code>: {} → {}</li>",
                ((k, v["from"], v["to"]) for k, v in diff.items()),
            ),
        )

    @admin.display(description="reconciliation result")
    def resolution_payload(self, obj: Approval):
        if obj.resolution_result is None:
            return "—"
        return format_html("<pre>{}</pre>", pretty_json(obj.resolution_result))
