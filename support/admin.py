from django.contrib import admin

from support.models import GatewayRefund, Order, OutboxMessage, Ticket, TicketNote

admin.site.register(
    Order,
    list_display=("order_id", "customer_name", "amount_cents", "currency", "status"),
    search_fields=("order_id",),
)
admin.site.register(
    Ticket,
    list_display=("ticket_id", "order", "subject", "status", "resolved_by", "resolved_at"),
    list_filter=("status",),
)
admin.site.register(TicketNote, list_display=("ticket", "body", "created_at"))
admin.site.register(OutboxMessage, list_display=("order", "to", "created_at"))
admin.site.register(
    GatewayRefund,
    list_display=("order_id", "amount_cents", "idempotency_key", "created_at"),
    list_filter=("order_id",),
)
