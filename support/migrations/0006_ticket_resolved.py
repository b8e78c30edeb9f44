"""Tickets get a second status, `resolved` (a person finished the request by closing its
hand-over), with who and when. Tickets whose newest hand-over was closed before this migration
are resolved by whoever closed it, so the queue's open tickets are right from the start (the
same rule as the ticket page: the newest hand-over naming the ticket, or naming none and made
for the order's open ticket)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

HANDOVER = "handover"


def _resolve_closed_handovers(apps, schema_editor) -> None:
    Approval = apps.get_model("approvals", "Approval")
    Ticket = apps.get_model("support", "Ticket")
    newest: dict[int, object] = {}  # ticket pk -> its newest hand-over
    items = (
        Approval.objects.filter(kind=HANDOVER)
        .select_related("run")
        .order_by("created_at", "id")
        .iterator(chunk_size=500)
    )
    for item in items:
        run_input = item.run.input if isinstance(item.run.input, dict) else {}
        args = item.requested_args if isinstance(item.requested_args, dict) else {}
        named = args.get("ticket_id") or run_input.get("ticket_id")
        tickets = Ticket.objects.filter(
            order__order_id=args.get("order_id") or run_input.get("order_id")
        )
        ticket = (
            tickets.filter(ticket_id=named).first()
            if named
            else tickets.filter(status="open").order_by("id").first()
        )
        if ticket is not None:
            newest[ticket.pk] = item
    for ticket_pk, item in newest.items():
        if item.status == "resolved" and item.resolution == "closed":
            Ticket.objects.filter(pk=ticket_pk).update(
                status="resolved", resolved_by_id=item.decided_by_id, resolved_at=item.decided_at
            )


class Migration(migrations.Migration):
    dependencies = [
        ("support", "0005_short_search_pending_lists"),
        ("approvals", "0011_question_items"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="ticket",
            name="resolved_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="ticket",
            name="resolved_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="ticket",
            name="status",
            field=models.CharField(
                choices=[("open", "open"), ("resolved", "resolved")],
                default="open",
                max_length=20,
            ),
        ),
        migrations.RunPython(_resolve_closed_handovers, migrations.RunPython.noop),
    ]
