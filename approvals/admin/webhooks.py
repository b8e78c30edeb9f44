"""The admin of webhooks: endpoints (URL, secret, event types, active) and the outbox's
deliveries with their attempts and last response, and a "redeliver" action."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from approvals.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from approvals.notifications.delivery import redeliver
from approvals.notifications.outbox import EVENT_TYPES
from approvals.notifications.signing import BadSecret, masked, new_secret, secret_bytes


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="whsec_<base64>. Leave empty to keep the current one (a new endpoint gets a "
        "generated secret, shown once).",
    )
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in EVENT_TYPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every event type.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("url", "description", "secret", "event_types", "active")

    def clean_secret(self) -> str:
        secret = self.cleaned_data.get("secret", "").strip()
        if secret:
            try:
                secret_bytes(secret)
            except BadSecret as exc:
                raise forms.ValidationError(str(exc)) from None
        # empty: keep the current one (a new endpoint gets one generated when saved)
        return secret or self.instance.secret


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("url", "description", "events", "active", "secret_hint", "disabled_reason")
    list_filter = ("active",)
    readonly_fields = ("secret_hint", "disabled_reason", "created_at")

    @admin.display(description="events")
    def events(self, obj: WebhookEndpoint) -> str:
        return ", ".join(obj.event_types) or "all"

    @admin.display(description="secret")
    def secret_hint(self, obj: WebhookEndpoint) -> str:
        return masked(obj.secret)

    def save_model(self, request, obj: WebhookEndpoint, form, change: bool) -> None:
        if not obj.secret:
            obj.secret = new_secret()
            # the only time it is shown: the receiver needs it to verify signatures
            self.message_user(
                request,
                f"Signing secret for {obj.url}: {obj.secret} (copy it now; it is not shown again)",
                messages.WARNING,
            )
        if obj.active:
            obj.disabled_reason = ""
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "event_type",
        "status",
        "attempts",
        "last_status_code",
        "target",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "event_type", "endpoint")
    list_select_related = ("endpoint",)  # `target` names it on every row
    search_fields = ("=webhook_id", "=approval_id", "=run_id")
    date_hierarchy = "created_at"
    actions = ("redeliver_selected",)
    fields = (
        "webhook_id",
        "event_type",
        "target",
        "status",
        "attempts",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
        "last_attempt_at",
        "last_status_code",
        "last_error",
        "last_response_text",
        "tries",
        "delivered_at",
        "approval_id",
        "run_id",
        "payload",
        "created_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # the record of what was sent; "redeliver" is the one action

    @admin.display(description="to")
    def target(self, obj: WebhookDelivery) -> str:
        return str(obj.endpoint) if obj.endpoint_id else "AGENTRUNS_WEBHOOK_URL"

    @admin.display(description="last response")
    def last_response_text(self, obj: WebhookDelivery):
        return format_html("<pre>{}</pre>", obj.last_response) if obj.last_response else "—"

    @admin.display(description="tries")
    def tries(self, obj: WebhookDelivery):
        if not obj.attempt_log:
            return "—"
        return format_html(
            "<table><tr><th>at</th><th>status</th><th>error</th><th>ms</th><th>by</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (
                        e.get("at"),
                        e.get("status") or "—",
                        e.get("error") or "",
                        e.get("ms"),
                        e.get("by", ""),
                    )
                    for e in obj.attempt_log
                ),
            ),
        )

    @admin.display(description="payload")
    def payload(self, obj: WebhookDelivery):
        try:
            pretty = json.dumps(json.loads(obj.body), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = obj.body
        return format_html("<pre>{}</pre>", pretty)

    @admin.action(description="Redeliver (same webhook id, a fresh retry budget)")
    def redeliver_selected(self, request, queryset) -> None:
        if not request.user.has_perm("approvals.change_webhookendpoint"):
            self.message_user(request, "You may not redeliver webhooks.", messages.ERROR)
            return
        ids = list(queryset.exclude(status=DeliveryStatus.PENDING).values_list("id", flat=True))
        count = redeliver(ids, by=request.user.get_username())
        self.message_user(request, f"{count} delivery(ies) queued again.", messages.SUCCESS)
