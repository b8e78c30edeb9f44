from django.urls import path

from . import views

urlpatterns = [
    path("", views.inbox, name="approval-inbox"),
    path("<int:approval_id>/decide/", views.decide, name="approval-decide"),
]
