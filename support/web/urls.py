from django.urls import path

from support.web import views

urlpatterns = [
    path("", views.ticket_queue, name="ticket-queue"),
    path("<str:ticket_id>/", views.ticket_detail, name="ticket-detail"),
    path("<str:ticket_id>/run/", views.ticket_run, name="ticket-run"),
    path("<str:ticket_id>/handover/take/", views.handover_take, name="ticket-handover-take"),
    path("<str:ticket_id>/handover/refund/", views.handover_refund, name="ticket-handover-refund"),
    path("<str:ticket_id>/handover/reply/", views.handover_reply, name="ticket-handover-reply"),
    path("<str:ticket_id>/handover/close/", views.handover_close, name="ticket-handover-close"),
]
