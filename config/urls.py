from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from agentruns import health
from agentruns.api import runs as runs_api
from approvals import api as approvals_api
from support import gateway

api_patterns = [
    path("runs", runs_api.create_run, name="api-runs"),
    path("runs/<str:run_id>", runs_api.run_detail, name="api-run"),
    path("runs/<str:run_id>/events", runs_api.run_events, name="api-run-events"),
    path("runs/<str:run_id>/cancel", runs_api.cancel_run, name="api-run-cancel"),
    path("runs/<str:run_id>/retry", runs_api.retry_run, name="api-run-retry"),
    path("runs/<str:run_id>/fork", runs_api.fork_run, name="api-run-fork"),
    path(
        "runs/<str:run_id>/steps/<int:index>/resolve",
        runs_api.resolve_step,
        name="api-step-resolve",
    ),
    path("approvals", approvals_api.approval_list, name="api-approvals"),
    path("approvals/<str:approval_id>", approvals_api.approval_decide, name="api-approval"),
]

urlpatterns = [
    path("", RedirectView.as_view(url="/runs/", permanent=False)),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include(api_patterns)),
    path("gateway/refunds", gateway.refunds, name="gateway-refunds"),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
    path("runs/", include("agentruns.urls")),
    path("approvals/", include("approvals.urls")),
]
