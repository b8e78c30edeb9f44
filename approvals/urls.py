from django.urls import path

from approvals import views

urlpatterns = [
    path("", views.inbox, name="approval-inbox"),
    path("<int:approval_id>/decide/", views.decide, name="approval-decide"),
]
