from django.urls import path

from approvals.web import actions as inbox_actions
from approvals.web import history, views

urlpatterns = [
    path("", views.inbox, name="approval-inbox"),
    path("decided/", history.decided, name="approval-decided"),
    path("bulk/", inbox_actions.bulk_decide, name="approval-bulk"),
    path("<int:approval_id>/", inbox_actions.item, name="approval-item"),
    path("<int:approval_id>/decide/", views.decide, name="approval-decide"),
    path("<int:approval_id>/claim/", inbox_actions.claim, name="approval-claim"),
    path("<int:approval_id>/release/", inbox_actions.release, name="approval-release"),
    path("<int:approval_id>/allow/", inbox_actions.allow_operation, name="approval-allow"),
]
