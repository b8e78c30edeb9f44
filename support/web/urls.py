from django.urls import path

from support.web import views

urlpatterns = [
    path("", views.ticket_queue, name="ticket-queue"),
    path("<str:ticket_id>/", views.ticket_detail, name="ticket-detail"),
    path("<str:ticket_id>/run/", views.ticket_run, name="ticket-run"),
]
